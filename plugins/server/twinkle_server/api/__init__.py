"""The wire: the Tinker-compatible routes (`tinker/`), the OpenAI-compatible ones (`openai/`), the native twinkle
routes (`native/`), the web console (`console/`) and the ASGI middleware. Each translates between a wire format and
calls of the service (`twinkle_server.service.core`)."""
