"""One `specctl serve` on the demo pair, shared by the endpoint tests of the session."""

from collections.abc import Iterator

import pytest

from tests.server.serve_process import DEMO_DRAFT, DEMO_TARGET, ServeProcess

API_KEY = "sk-test-0123456789abcdef"
MODEL = "demo"
MAX_MODEL_LEN = 512
MAX_BATCH_SIZE = 4
K = 4


@pytest.fixture(scope="session")
def server() -> Iterator[ServeProcess]:
    """The demo pair (draft model, fixed k), an API key, a short context for the limit tests."""
    serve = ServeProcess(
        "--target", DEMO_TARGET, "--draft", DEMO_DRAFT, "-k", str(K),
        "--served-model-name", MODEL,
        "--max-batch-size", str(MAX_BATCH_SIZE),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--dtype", "float32",
        api_key=API_KEY,
    )  # fmt: skip
    try:
        yield serve
    finally:
        assert serve.close() == [], "specctl serve left processes behind"
        assert serve.process.returncode == 0, serve.log()
