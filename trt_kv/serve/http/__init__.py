"""OpenAI's HTTP API over an :class:`~trt_kv.serve.scheduler.EngineLoop`: the request and
response shapes typed once (``protocol.py``), thin handlers that translate a request into a
prompt and sampling parameters and the loop's token events back into choices
(``completions.py``), metrics (``metrics.py``) and the app (``app.py``:
:func:`~trt_kv.serve.http.app.create_app`). Nothing here schedules, samples or runs a step."""
