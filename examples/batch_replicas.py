"""Many extractions on two model replicas, results in order (``structspec.Replicas``).

    .venv/bin/python examples/batch_replicas.py

The replicas are spawned processes that import this script again: they start under the
``__main__`` guard, and the Pydantic class they validate with lives at the top level.
"""

from pydantic import BaseModel, Field

from structspec import Replicas


class Person(BaseModel):
    name: str
    age: int
    city: str
    languages: list[str] = Field(max_length=3)


LINES = ["Ana Ruiz, 31, lives in Lisbon and speaks Portuguese and French.",
         "Tom Berg, 45, from Oslo, speaks Norwegian.",
         "Li Wei, 28, Xi'an, speaks Mandarin and English."]

if __name__ == "__main__":
    requests = [{"prompt": f"Extract: {line}", "schema": Person} for line in LINES]
    with Replicas(replicas=2, threads=1) as pool:
        for person in pool.map(requests):
            print(person.value)
        print(pool.totals.as_dict()["new_tokens"], "tokens in all")
