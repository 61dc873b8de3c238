"""Kind `env`: multi-turn environments a policy acts in during a rollout (`twinkle_agentic.envs`)."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.env.base import Env, StepResult

__all__ = ['Env', 'StepResult']
__getattr__ = kind_getattr('env', __name__)
