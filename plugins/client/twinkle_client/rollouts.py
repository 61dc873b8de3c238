"""`RolloutSessions`: run an unmodified agent in rollout sessions of a twinkle server and take back its episodes.

    sessions = RolloutSessions(base_url, api_key, concurrency=8)
    groups = sessions.run(policy, harness, tasks, group_size=4)   # harness(session_url, policy, task) -> reward
    for group in groups:                                          # one group per task, its runs in order
        episodes = [e for run in group for e in run.episodes]     # training rows, each with its reward

Per run: a session is opened on `policy` (a hosted base model or a saved sampler checkpoint: every call of the run
samples exactly it), the harness runs the agent against the session's OpenAI base URL and scores what it did, the
reward is posted, the episodes (token-exact: ``input_ids``, ``labels``, ``logprobs`` per trained label, ``reward``)
are read back and the session is deleted. Runs go `concurrency` at a time, each in its own session, with a
progress bar. The server's routes are in docs/agents.md; nothing here needs torch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tqdm import tqdm

from twinkle_client.http import Connection
from twinkle_core.errors import InvalidInputError, TwinkleError

#: ``harness(session_base_url, policy, task) -> reward``: runs the agent (pointed at the URL, naming `policy` as
#: its model) on `task` and scores the outcome.
Harness = Callable[[str, str, Any], float]


@dataclass
class AgentRun:
    """One agent run: its task, the reward the harness gave, the session's episodes (``reward`` set on each) and
    splits (where the agent's history stopped extending what was sampled), and `error` when the harness raised
    (then `reward` is the `failure_reward`)."""

    task: Any
    reward: float
    episodes: list[dict[str, Any]] = field(default_factory=list)
    splits: list[dict[str, Any]] = field(default_factory=list)
    session_id: str = ''
    error: str | None = None


class RolloutSessions:
    """Runs agents in rollout sessions of the server at `base_url` (module docstring).

    Args:
        concurrency: agent runs in flight at once (threads; the server samples concurrent calls together).
        ttl_s / max_calls / max_tokens: each session's caps (None: the server's defaults).
        failure_reward: the reward of a run whose harness raised (None: the error is raised, naming the task).
        keep_sessions: leave the sessions on the server (they expire after `ttl_s`) instead of deleting them.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        concurrency: int = 8,
        ttl_s: float | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        failure_reward: float | None = None,
        keep_sessions: bool = False,
        timeout_s: float = 600.0,
    ) -> None:
        if concurrency < 1:
            raise InvalidInputError(f'concurrency must be >= 1, got {concurrency}')
        self.base_url = base_url.rstrip('/')
        self.conn = Connection(self.base_url, api_key, timeout_s=timeout_s)
        self.concurrency = concurrency
        caps = {'ttl_s': ttl_s, 'max_calls': max_calls, 'max_tokens': max_tokens}
        self.caps = {k: v for k, v in caps.items() if v is not None}  # the server checks them
        self.failure_reward = failure_reward
        self.keep_sessions = keep_sessions

    def run(
        self, policy: str, harness: Harness, tasks: Sequence[Any], *, group_size: int = 1, progress: bool = True
    ) -> list[list[AgentRun]]:
        """Every task run `group_size` times (GRPO: a group per task), each run in its own session of `policy`;
        per task its runs, in order."""
        if group_size < 1:
            raise InvalidInputError(f'group_size must be >= 1, got {group_size}')
        jobs = [task for task in tasks for _ in range(group_size)]
        bar = tqdm(total=len(jobs), desc='agent runs', unit='run', disable=not progress, leave=False)
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix='twinkle-agent') as pool:
            runs = list(pool.map(lambda task: self._one(policy, harness, task, bar), jobs))
        bar.close()
        return [runs[i : i + group_size] for i in range(0, len(runs), group_size)]

    def _one(self, policy: str, harness: Harness, task: Any, bar: tqdm) -> AgentRun:
        session = self.conn.post('/v1/rollouts', {'model': policy, **self.caps})
        try:
            error = None
            try:
                reward = float(harness(f'{self.base_url}{session["base_url"]}', policy, task))
            except Exception as exc:  # the agent's own code failed: the run scores failure_reward, or stops all
                if self.failure_reward is None:
                    raise TwinkleError(f'the agent harness failed on task {task!r}: {exc!r}') from exc
                reward, error = self.failure_reward, repr(exc)
            self.conn.post(f'/v1/rollouts/{session["id"]}/reward', {'reward': reward})
            recorded = self.conn.get(f'/v1/rollouts/{session["id"]}/episodes')
        finally:
            if not self.keep_sessions:
                self.conn.delete(f'/v1/rollouts/{session["id"]}')
        bar.update(1)
        return AgentRun(task, reward, recorded['data'], recorded['splits'], session['id'], error)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RolloutSessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
