"""`import twinkle_core` stays cheap: no torch, no transformers, no plugin module, no entry point loaded."""

from __future__ import annotations

import json

from core_helpers import run_python


def test_import_twinkle_core_is_cheap() -> None:
    out = run_python("""
        import json, sys
        import twinkle_core
        from importlib import metadata
        eps = [ep for d in metadata.distributions() for ep in d.entry_points if ep.group.startswith('twinkle.')]
        print(json.dumps({
            'heavy': sorted(m for m in ('torch', 'transformers', 'peft', 'datasets', 'modelscope',
                                        'huggingface_hub', 'numpy', 'pluggy') if m in sys.modules),
            'plugins': sorted(m for m in sys.modules if m.startswith('twinkle_') and not m.startswith('twinkle_core')),
            'loaded_entry_points': sorted(ep.value for ep in eps if ep.module in sys.modules),
            'num_entry_points': len(eps),
        }))
    """)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result['heavy'] == []
    assert result['plugins'] == []
    assert result['loaded_entry_points'] == []
    assert result['num_entry_points'] >= 4  # at least twinkle-core's own


def test_resolving_one_name_loads_only_that_entry_point() -> None:
    out = run_python("""
        import sys
        from twinkle_core import resolve
        resolve('runtime', 'local')
        print('twinkle_core.runtime.local' in sys.modules, 'twinkle_core.hooks.loggers' in sys.modules,
              'torch' in sys.modules)
    """)
    assert out.stdout.split() == ['True', 'False', 'False'], out.stderr
