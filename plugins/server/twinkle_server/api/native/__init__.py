"""Native twinkle API (`/twinkle/v1`): remote `Model` / `Sampler` calls built from the interface declarations."""
