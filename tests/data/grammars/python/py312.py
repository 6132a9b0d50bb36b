# Python 3.12 syntax a completion may meet
import asyncio
from dataclasses import dataclass, field
from . import sibling
from ..pkg import (a, b as c,)

type Pair[T] = tuple[T, T]
type Alias = int | None


def first[T](xs: list[T], /, default: T | None = None, *, strict: bool = False) -> T | None:
    return xs[0] if xs else default


class Box[T: (int, str), *Ts, **P]:
    items: list[T] = []

    def __init__(self, *args: *Ts, **kwargs) -> None:
        self.args = args


@dataclass(frozen=True)
@(lambda cls: cls)
class Point:
    x: float = 0.0
    y: float = field(default=0.0)


async def fetch(urls):
    async with asyncio.timeout(1):
        async for u in aiter(urls):
            yield u
    results = [await f for f in urls if (n := len(f)) > 2]
    return results


def handle(command):
    match command.split():
        case [action]:
            pass
        case ["go", direction] | ["move", direction]:
            print(f"going {direction!r:>10}", sep="", end="\n")
        case Point(x=0, y=0) as origin:
            pass
        case {"kind": "circle", **rest}:
            pass
        case [1, 2, *others] if others:
            pass
        case -1 | 1.5 | 2j | -3 + 4j | "s" | b"b" | None | True:
            pass
        case (a, b, *_):
            pass
        case _:
            pass


def groups():
    try:
        raise ExceptionGroup("eg", [ValueError(1)])
    except* ValueError as e:
        print(*e.exceptions, sep="")
    except* (TypeError, KeyError):
        pass
    finally:
        pass


def scopes():
    count = 0

    def inner():
        nonlocal count
        global GLOBAL
        count += 1
        del GLOBAL

    with (open("a") as f, open("b") as g):
        pass
    with (open("a"), open("b")):
        pass
    with open("a") as f, open("b"):
        pass
    return inner


match = re_match = None
match.group(1)
match: int = 3
case = type = 1
type(case)
values = {**{"a": 1}, "b": 2}
squares = {x: x * x for x in range(10) if x % 2 == 0}
first_, *rest = 1, 2, 3
print(*rest, **values)
x = lambda a, b=2, *args, c, **kw: (a, b, args, c, kw)
big = 1_000_000 + 0x_ff + 0o17 + 0b1010 + 1.5e-3 + 3j + .5 + 5.
s = rb"\d" + br'\w' + b"\x00"
t = "implicit" 'concat' f"{x}" rf"\d{x}"
n = not x is not None and x in [1, 2] or x not in (3,)
y = x if x else -x ** 2 // 3 @ x % 4 << 1 >> 2 & 3 ^ 4 | 5
assert isinstance(x, int), "message"
for i, (j, k) in enumerate([(1, 2)]):
    continue
else:
    pass
while False:
    break
if x:
    pass
elif y:
    pass
else:
    pass
total = 0; total += 1; total //= 2
long_line = 1 + \
    2
# explicit joins at the start of a line: the first join at a column > 0 sets the
# indentation; joins at column 0 leave it to what follows
\
after_join = 1
if long_line:
    x = 1
\
    \
  y = 2
    \
        z = 3
