"""Small torch-free helpers shared by the core and the plugins (import the submodule you need)."""
