"""What XLA made of a program's loops, read from its optimized HLO text (``compiled.as_text()``,
or ``hlo_modules()[0].to_string()`` of a loaded executable): each ``while`` with its op name, the
trip count XLA knows (``known_trip_count``) or none, and the kernels one iteration launches.

No JAX, no TensorFlow: plain text in, plain dicts out, so ``run.py`` reports it and the tests
check it on any machine.

What counts as a kernel (``kernels_per_iteration``): every instruction of the loop's body that
runs as a thunk on the device it was compiled for: a ``fusion`` (one kernel, its fused
computation not entered), a ``custom-call`` (cuBLAS, cuDNN, ...), a ``copy``, a ``sort`` and
every other opcode, except the ones that run nothing (`NO_OP`) and the ``-done`` half of an
asynchronous pair (its ``-start`` counts). Control flow is entered, not counted: a ``call``
(XLA:GPU's command buffers, XLA:CPU's outlined random draws) adds its computation's kernels, a
nested ``while`` its body's kernels times its known trip count (once when unknown, and the
iteration is marked ``nested_unknown``), a ``conditional`` its largest branch. The loop's
condition is not counted (a counted loop runs it on the device, if at all).

``launches_per_iteration`` counts what the host launches per iteration instead: a call of a
command buffer (XLA:GPU names their computations ``command_buffer``; one CUDA graph launch) is
one, however many kernels it holds, and a loop that runs inside a command buffer launches
nothing from the host (``in_command_buffer``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: opcodes with no thunk (layout, tuples, tokens, scheduling barriers)
NO_OP = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
    }
)
#: what XLA:GPU's command-buffer scheduling names the computations it outlines
COMMAND_BUFFER = "command_buffer"

HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")
CALLED = re.compile(
    r"\b(body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)"
)
BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
OP_NAME = re.compile(r'\bop_name="([^"]*)"')
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclass
class Instruction:
    """One HLO instruction: its opcode and the computations it calls, by role."""

    name: str
    opcode: str
    called: dict[str, list[str]] = field(default_factory=dict)
    op_name: str = ""
    trip_count: int | None = None


def parse(text: str) -> dict[str, list[Instruction]]:
    """The instructions of each computation of an HLO module's text, by computation name."""
    computations: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(1), [])
            continue
        if line.startswith("}"):
            current = None
            continue
        match = INSTRUCTION.match(line) if current is not None else None
        if match is None:
            continue
        opcode = OPCODE.match(skip_shape(match.group(2)))
        if opcode is None:
            continue
        called: dict[str, list[str]] = {}
        for role, name in CALLED.findall(line):
            called.setdefault(role, []).append(name)
        for branches in BRANCHES.findall(line):
            called["branch"] = [b.strip().lstrip("%") for b in branches.split(",") if b.strip()]
        op_name = OP_NAME.search(line)
        trips = TRIP_COUNT.search(line)
        current.append(
            Instruction(
                name=match.group(1),
                opcode=opcode.group(1),
                called=called,
                op_name=op_name.group(1) if op_name else "",
                trip_count=int(trips.group(1)) if trips else None,
            )
        )
    return computations


def skip_shape(rest: str) -> str:
    """``rest`` (what follows ``name =``) without its leading shape: a tuple ``(...)``, nested
    and with ``/*index=5*/`` comments, or one array shape such as ``f32[8,64]{1,0}``."""
    if rest.startswith("("):
        depth = 0
        for i, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                return rest[i + 1 :].lstrip()
        return ""
    _, _, after = rest.partition(" ")
    return after.lstrip()


class Counter:
    """Kernels and host launches of computations of one module (memoized)."""

    def __init__(self, computations: dict[str, list[Instruction]]) -> None:
        self.computations = computations
        self.memo: dict[tuple[str, bool], tuple[int, int, bool]] = {}

    def count(self, name: str, launches: bool) -> tuple[int, bool]:
        """(kernels or host launches of one run of computation ``name``, whether it holds a
        loop whose trip count is unknown)."""
        total, _, unknown = self.counted(name, launches)
        return total, unknown

    def counted(self, name: str, launches: bool) -> tuple[int, int, bool]:
        key = (name, launches)
        if key not in self.memo:
            self.memo[key] = (0, 0, False)  # a cycle (none in valid HLO) counts nothing
            total, buffers, unknown = 0, 0, False
            for inst in self.computations.get(name, []):
                n, b, u = self.instruction(inst, launches)
                total, buffers, unknown = total + n, buffers + b, unknown or u
            self.memo[key] = (total, buffers, unknown)
        return self.memo[key]

    def instruction(self, inst: Instruction, launches: bool) -> tuple[int, int, bool]:
        """(kernels or launches, command-buffer calls, unknown loop inside) of one run."""
        if inst.opcode in NO_OP or inst.opcode.endswith("-done"):
            return 0, 0, False
        if inst.opcode == "while":
            n, b, u = self.counted(inst.called["body"][0], launches)
            trips = inst.trip_count
            return n * (trips or 1), b * (trips or 1), u or trips is None
        if inst.opcode == "conditional":
            branches = [
                self.counted(c, launches)
                for role in ("branch", "true_computation", "false_computation")
                for c in inst.called.get(role, [])
            ]
            worst = max(branches, default=(0, 0, False))
            return worst[0], worst[1], any(u for _, _, u in branches)
        if inst.opcode == "call":
            target = inst.called.get("to_apply", [""])[0]
            if launches and target.startswith(COMMAND_BUFFER):
                return 1, 1, False  # one graph launch from the host
            return self.counted(target, launches)
        return 1, 0, False


def loops(text: str) -> list[dict[str, Any]]:
    """Every ``while`` of the module, in text order: its op name (metadata), the computation it
    is in, XLA's known trip count (None when unknown), the kernels and host launches of one
    iteration, the command-buffer calls in one iteration, and whether it runs inside one."""
    computations = parse(text)
    counter = Counter(computations)
    in_buffers = reachable(computations, [c for c in computations if c.startswith(COMMAND_BUFFER)])
    out = []
    for where, instructions in computations.items():
        for inst in instructions:
            if inst.opcode != "while":
                continue
            body = inst.called["body"][0]
            kernels, unknown = counter.count(body, launches=False)
            launches, buffers, _ = counter.counted(body, launches=True)
            inside = where in in_buffers
            out.append(
                {
                    "op_name": inst.op_name,
                    "computation": where,
                    "known_trip_count": inst.trip_count,
                    "kernels_per_iteration": kernels,
                    "nested_unknown": unknown,
                    "launches_per_iteration": 0 if inside else launches,
                    "command_buffers_per_iteration": 0 if inside else buffers,
                    "in_command_buffer": inside,
                }
            )
    return out


def reachable(computations: dict[str, list[Instruction]], roots: list[str]) -> set[str]:
    """The computations ``roots`` run, themselves included (fusions' bodies left out)."""
    seen, todo = set(roots), list(roots)
    while todo:
        for inst in computations.get(todo.pop(), []):
            for role, names in inst.called.items():
                for name in names if role != "calls" else []:
                    if name not in seen:
                        seen.add(name)
                        todo.append(name)
    return seen


def sgd_loop(found: list[dict[str, Any]], name: str = "sgd_steps") -> dict[str, Any] | None:
    """The counted SGD loop among ``found``: the first ``while`` whose op name ends in ``name``
    and whose trip count XLA knows; else the first ending in ``name``; else None."""
    named = [loop for loop in found if loop["op_name"].split("/")[-1] == name]
    counted = [loop for loop in named if loop["known_trip_count"] is not None]
    return (counted or named or [None])[0]


def summary(found: list[dict[str, Any]]) -> str:
    """``op_name n=K`` (or ``n=?``) of each loop, for one line of output."""
    return ", ".join(
        f"{loop['op_name'] or loop['computation']} n={loop['known_trip_count'] or '?'}"
        for loop in found
    )
