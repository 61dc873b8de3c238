"""Serves the Twinkle documents' ``twinkle.server`` package path (the server itself is the twinkle-server plugin)."""
