"""The wire protocol shared by the daemons and the tools: messages and transport. Imports neither."""
