"""Bounds of the sample records, shared by the wire (`messages.Sample`, `messages.SampleReport`) and
the settings that fill them (`[samples]` in run.toml), so that a setting the config accepts always
fits its record. A module of constants alone: the config imports it without the messages."""

#: The longest prompt a sample record holds, in characters.
MAX_SAMPLE_PROMPT = 1024
#: The most samples one record holds.
MAX_SAMPLES = 64
