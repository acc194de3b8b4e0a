"""Integrations with web frameworks, each importing its framework only when used."""
