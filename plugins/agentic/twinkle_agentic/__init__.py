"""twinkle-agentic: multi-turn rollouts with tool calling (`rollout`), sandboxed tools (`tools`) and
environments (`envs`) for agentic RL on twinkle_core."""
