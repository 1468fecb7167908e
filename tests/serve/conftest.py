"""One tiny served model per test session, and a server of it per module that asks."""

import pytest

from tests.support.servers import TINY_OPTIONS, app_server, write_tiny_served_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The tiny checkpoint folder (word-level tokenizer ``w0`` .. ``w96``, chat template)."""
    return write_tiny_served_model(tmp_path_factory.mktemp("served") / "tiny")


@pytest.fixture(scope="module")
def server(tiny_dir):
    """``(base_url, app)`` of ``trt-kv serve --model tiny`` on a free loopback port."""
    with app_server(["--model", str(tiny_dir), *TINY_OPTIONS]) as served:
        yield served


@pytest.fixture
def client(server):
    import openai

    url, _ = server
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as c:
        yield c
