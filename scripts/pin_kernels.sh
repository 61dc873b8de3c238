#!/usr/bin/env bash
# Re-pin the first-party kernels (hub/*-kernel) in registry/hub.toml after changing them: rewrites the kernel
# section (everything from its header line on) with what `twinkle hub hash --repo` prints.
set -euo pipefail
cd "$(dirname "$0")/.."
header='# Kernels in the Hugging Face `kernels` layout'
toml=registry/hub.toml
head -n "$(($(grep -n -F "$header" "$toml" | cut -d: -f1) - 1))" "$toml" > "$toml.new"
{
  echo "$header, pinned file by file (the [component.files] map) as well as by folder."
  echo "# Re-pin after changing one: bash scripts/pin_kernels.sh"
  for folder in rmsnorm-kernel swiglu-kernel; do
    .venv/bin/twinkle hub hash "hub/$folder" --repo "hf://twinkle-community/$folder" --revision v1 | grep -v '^# hub/'
  done
} >> "$toml.new"
mv "$toml.new" "$toml"
