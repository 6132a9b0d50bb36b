"""End to end on the embedded default model (SmolLM2-135M-Instruct): a handful of schemas,
every output validated with jsonschema. Few and short, to keep the default run fast."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

pytestmark = pytest.mark.real_model
ROOT = Path(__file__).resolve().parents[1]

PROMPTS = {
    "person": "Extract the person: Maria Lopez is 34, lives in Madrid, email "
    "maria.lopez@example.com, and enjoys chess and hiking.",
    "function_call": "What's the weather like in Boston in fahrenheit?",
    "issue_report": "Bug: export crashes on Windows when the file name has an emoji. Steps: "
    "open a project, rename it, click export. High severity, always happens, component: "
    "exporter.",
}


@pytest.fixture(scope="module")
def gen(smollm_tokenizer):
    from structspec.api import Generator

    return Generator()


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_shipped_schemas(gen, name):
    schema = json.loads((ROOT / "schemas" / f"{name}.json").read_text())
    result = gen.run(PROMPTS[name], schema=schema, max_new_tokens=160)
    jsonschema.validate(result.value, schema)
    assert result.stats.forward_passes <= result.stats.new_tokens + 1


def test_bfcl_function_calls(gen, shared_data):
    path = shared_data / "bfcl" / "bfcl_dev.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    tasks = [json.loads(line) for line in path.read_text().splitlines()[:3]]
    for task in tasks:
        schema = task["call_json_schema"]
        result = gen.run(task["messages"][-1]["content"], schema=schema, max_new_tokens=160)
        jsonschema.validate(result.value, schema)
        assert result.value["name"] == schema["properties"]["name"]["const"]


def test_pydantic_on_the_real_model(gen):
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    city = gen.generate("Paris is the capital of France. Give the city.", schema=City,
                        max_new_tokens=60)
    assert isinstance(city, City) and city.name
