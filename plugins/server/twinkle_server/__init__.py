"""twinkle-server: a multi-tenant LoRA training service with a Tinker-compatible API and the native twinkle API.

    from twinkle_server import ServerConfig, create_app, serve
    serve(ServerConfig(models={'Qwen/Qwen3-0.6B': '/models/qwen3'}, data_dir='./data'))
"""
from twinkle_server.config import ServerConfig, TenantLimits
from twinkle_server.launch import create_app, serve, start_in_thread

__all__ = ['ServerConfig', 'TenantLimits', 'create_app', 'serve', 'start_in_thread']
