"""Serving many users from one engine: a scheduler over one ``Session`` (``scheduler/``:
slots, tokens, continuous batching; never HTTP) and OpenAI's HTTP API over it (``http/``)."""
