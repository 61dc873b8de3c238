"""An OpenAI-compatible endpoint on the training server, so trained adapters serve any OpenAI client
(docs/openai.md): `router` (routes), `schemas` (request/response bodies), `models` (what `model` names),
`chat` (rendering with the model's chat template and the tool-call formats of `twinkle_core.template.tool_calls`),
`text` (token ids -> text), `sampling` (through the service's sampling queue), `responses` / `streaming` (answers,
SSE), `errors` (OpenAI's error shape)."""
