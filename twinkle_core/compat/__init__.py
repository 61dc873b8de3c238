"""Compatibility aliases, in one place: every module path and name that exists only so that a listing of the
Twinkle documents runs with ``twinkle`` renamed to ``twinkle_core`` (docs/coming_from_twinkle.md). (Modules moved
inside the core keep no old path: nothing outside imports one.)

The code that only the documents' names need lives here: `helpers` (``get_logger``, ``get_device_placement``,
``DingNotifier``) and `tinker` (``init_tinker_client``, ``input_feature_to_datum``). Every public alias module is a
thin re-export whose one-line docstring names the path it serves; `ALIAS_MODULES` lists them with the module
holding the code (tests/core/test_layering.py checks that each re-exports that module's very objects).

| the documents' name | served by | code |
|---|---|---|
| ``twinkle.get_logger``, ``get_device_placement``, ``DingNotifier`` | `twinkle_core.__getattr__` | `compat.helpers` |
| ``twinkle.init_tinker_client`` | `twinkle_core.__getattr__` | `compat.tinker` |
| ``twinkle.server.common.input_feature_to_datum`` | `twinkle_core/server/common.py` | `compat.tinker` |
| ``twinkle.data_format.*`` (``SamplingParams``, ...) | `twinkle_core/data_format.py` | `twinkle_core.types` |
| ``twinkle.dataloader.DataLoader`` | `twinkle_core/dataloader.py` | `twinkle_core.dataset` |
| ``twinkle.preprocessor.llm.<Name>`` | `twinkle_core/preprocessor/llm.py` | the registry (any preprocessor) |
| ``twinkle.checkpoint_engine.*`` | `twinkle_core/checkpoint_engine/` | `twinkle_core.weight_sync` |
| ``twinkle.model.TwinkleModel`` | `twinkle_core/model/__init__.py` | `twinkle_core.model.Model` |
| ``'InputProcessor'``, ``'Qwen3_5Template'`` (names) | entry points, pyproject.toml | the registered classes |
"""

#: public alias module -> the module whose objects it re-exports
ALIAS_MODULES: dict[str, str] = {
    # paths of the Twinkle documents
    'twinkle_core.data_format': 'twinkle_core.types',
    'twinkle_core.dataloader': 'twinkle_core.dataset.dataloader',
    'twinkle_core.server.common': 'twinkle_core.compat.tinker',
    'twinkle_core.checkpoint_engine': 'twinkle_core.weight_sync',
}
