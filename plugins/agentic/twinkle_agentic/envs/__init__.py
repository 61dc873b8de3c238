"""Environments for multi-turn rollouts (kind ``env``): `GuessNumberEnv`, `CalculatorTaskEnv`, and the `Env`
interface with its `StepResult` (re-exported from `twinkle_core.env`)."""

from twinkle_agentic.envs.calculator_task import CalculatorTaskEnv
from twinkle_agentic.envs.guess_number import GuessNumberEnv
from twinkle_core.env import Env, StepResult

__all__ = ['CalculatorTaskEnv', 'Env', 'GuessNumberEnv', 'StepResult']
