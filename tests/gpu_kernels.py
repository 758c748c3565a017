"""Placing a graph on a GPU without one: every op checked against TensorFlow's GPU kernels.

The plain ``tensorflow`` wheel for Linux x86-64 registers its CUDA kernels even on a machine
without a GPU, and `get_registered_kernels_for_op` lists them with their dtype constraints and
their host-memory arguments. That is enough to do, for one graph, what TensorFlow's placer and
its memory-type pass would do on a GPU machine:

- every op goes to the GPU when a GPU kernel matches its dtypes, else it falls back to the CPU
  (a finding: ``no-gpu-kernel``); under XLA (``_XlaMustCompile``) every op must have an
  ``XLA_GPU_JIT`` kernel instead (``no-xla-gpu-kernel``);
- each input and output lives in host memory when the kernel declares it so (int32 arguments of
  most GPU kernels, shapes, axes, ``maxval`` of a random integer draw, a switch's predicate),
  else in device memory;
- a device-memory output feeding a host-memory input is a device-to-host copy, a stall of the
  host thread; when the value depends on data (anything but constants and static shapes) and it
  happens inside a ``tf.while_loop``, it is paid every iteration (``device-to-host``).

Functions are followed as TensorFlow runs them: calls are inlined, ``While``/``If``/``Case``
are lowered to ``Switch``/``Merge``/``NextIteration`` (their loop variables live where the GPU
``Merge`` kernel for their dtype keeps them: int32 in host memory, the rest on the device), and
a condition's predicate is a ``Switch``'s host-memory ``pred``.

What it does not model: ops pinned to the CPU on purpose (it assumes the whole graph belongs on
the GPU, which is what the library promises for the graphs it checks), and copies XLA makes
inside a compiled cluster (an XLA:GPU while loop reads its predicate once per iteration).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import function_def_to_graph, kernels

GPU_DEVICES = ("GPU", "DEFAULT")
XLA_GPU = "XLA_GPU_JIT"
HOST, DEVICE = "host", "device"
#: dtypes TensorFlow keeps in host memory whatever the kernel says (DataTypeAlwaysOnHost)
ALWAYS_ON_HOST = {types_pb2.DT_STRING, types_pb2.DT_RESOURCE}
#: ops whose output is shape metadata, known when the graph is built
SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank", "VariableShape", "TensorListLength"}
CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}
WHILE_OPS = {"While", "StatelessWhile"}
IF_OPS = {"If", "StatelessIf"}
CASE_OPS = {"Case", "StatelessCase"}
#: eager ops of tf.data's pipeline, which runs on the host by design (its elements arrive
#: there); the functions it maps are placed like any other
HOST_SUFFIXES = ("Dataset", "DatasetV2", "DatasetV3")
#: ops that forward their input; see `Placement._place_op`
PASS_THROUGH = {"Identity", "Snapshot"}
#: ops that are function arguments, not kernels
ARG_OPS = {"Placeholder", "_Arg"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One reason a graph would not run on a GPU as promised.

    Attributes:
        kind: ``no-gpu-kernel``, ``no-xla-gpu-kernel`` or ``device-to-host``.
        op: the op type (and, for copies, the consumer's input).
        detail: the dtypes, or the copied tensor and the input it feeds.
        where: the function path down to the op (``train/while_body/cond_true``).
        loop_depth: how many ``tf.while_loop`` s enclose it (0: once per call).
    """

    kind: str
    op: str
    detail: str
    where: str
    loop_depth: int

    def __str__(self) -> str:
        loop = f", inside {self.loop_depth} loop(s)" if self.loop_depth else ""
        return f"{self.kind}: {self.op} ({self.detail}) in {self.where}{loop}"


def cuda_kernels_registered() -> bool:
    """Whether this TensorFlow registers CUDA kernels (the plain wheel on Linux x86-64 does;
    ``tensorflow-cpu`` does not)."""
    listed = kernels.get_registered_kernels_for_op("MatMul").kernel
    return any(k.device_type == "GPU" for k in listed)


def register_xla_kernels() -> None:
    """Make TensorFlow register its XLA JIT kernels (it does at the first ``jit_compile``)."""
    tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(1.0))


@functools.cache
def _kernels(op_type: str) -> tuple[Any, ...]:
    # cached: call `register_xla_kernels` before the first lookup
    return tuple(kernels.get_registered_kernels_for_op(op_type).kernel)


def _attr_types(op: tf.Operation, name: str) -> list[int]:
    value = op.node_def.attr[name]
    if value.HasField("type"):
        return [value.type]
    return list(value.list.type)


def _matches(kernel: Any, op: tf.Operation) -> bool:
    if kernel.label and op.node_def.attr["_kernel"].s.decode() != kernel.label:
        return False
    for constraint in kernel.constraint:
        if constraint.name not in op.node_def.attr:
            return False
        allowed = set(constraint.allowed_values.list.type)
        if not all(t in allowed for t in _attr_types(op, constraint.name)):
            return False
    return True


def gpu_kernel(op: tf.Operation, devices: Iterable[str] = GPU_DEVICES) -> Any | None:
    """The kernel TensorFlow would pick for ``op`` on ``devices``, or None."""
    found = [k for k in _kernels(op.type) if k.device_type in devices and _matches(k, op)]
    return max(found, key=lambda k: k.priority) if found else None


def _arg_slots(op: tf.Operation, args: Iterable[Any]) -> list[str]:
    """The op-def argument name of each input (or output) tensor of ``op``, in order."""
    names = []
    for arg in args:
        if arg.number_attr:
            count = op.get_attr(arg.number_attr)
        elif arg.type_list_attr:
            count = len(op.get_attr(arg.type_list_attr))
        else:
            count = 1
        names += [arg.name] * count
    return names


def dtypes_of(op: tf.Operation) -> str:
    """``T=int64, Tindices=int64``: the op's type attributes."""
    parts = []
    for key in sorted(op.node_def.attr):
        value = op.node_def.attr[key]
        if value.HasField("type"):
            parts.append(f"{key}={tf.dtypes.as_dtype(value.type).name}")
    return ", ".join(parts) or "no type attrs"


@dataclasses.dataclass
class _Value:
    """Where a tensor lives and whether it depends on data."""

    memory: str
    constant: bool


class Placement:
    """Places graphs on a GPU and collects the findings.

    Args:
        lookup: the `FunctionDef` of a function name (nested bodies, branches and calls).
    """

    def __init__(self, lookup: Callable[[str], Any]) -> None:
        self._lookup = lookup
        self._graphs: dict[str, tf.Graph] = {}
        self.findings: list[Finding] = []
        self.ops_seen = 0
        #: the path of every loop body placed without XLA (``train/sgd_steps_body_12``)
        self.loops: list[str] = []

    def _function(self, name: str) -> tf.Graph:
        if name not in self._graphs:
            self._graphs[name] = function_def_to_graph.function_def_to_graph(self._lookup(name))
        return self._graphs[name]

    def place_function(self, name: str) -> None:
        """Place function ``name`` as a call from the host (an eager call) would run it."""
        fdef = self._lookup(name)
        graph = self._function(name)
        args = [_Value(_arg_memory(t.dtype), False) for t in graph.inputs]
        self.place(graph, args, _short(name), 0, _must_compile_fn(fdef))

    def _report(self, kind: str, op: str, detail: str, where: str, depth: int) -> None:
        self.findings.append(Finding(kind, op, detail, where, depth))

    # -- XLA clusters ---------------------------------------------------------------------------

    def check_xla(self, graph: tf.Graph, where: str, depth: int) -> None:
        """Every op of ``graph`` (and its nested functions) has an XLA_GPU_JIT kernel."""
        for op in graph.get_operations():
            if op.type in ARG_OPS:
                continue
            self.ops_seen += 1
            if gpu_kernel(op, (XLA_GPU,)) is None:
                self._report("no-xla-gpu-kernel", op.type, dtypes_of(op), where, depth)
            for attr, inner in _function_attrs(op):
                self.check_xla(self._function(inner), f"{where}/{attr}", depth)

    # -- plain TensorFlow -------------------------------------------------------------------------

    def place(
        self, graph: tf.Graph, args: list[_Value], where: str, depth: int, xla: bool = False
    ) -> list[_Value]:
        """Place ``graph`` with its arguments ``args``; returns its outputs' values."""
        if xla:
            self.check_xla(graph, where, depth)
            return [_Value(DEVICE, False) for _ in graph.outputs]
        values: dict[Any, _Value] = {}
        placeholders = [op for op in graph.get_operations() if op.type in ARG_OPS]
        for op, value in zip(placeholders, args, strict=False):
            values[op.outputs[0].ref()] = value
        for op in graph.get_operations():
            if op.type in ARG_OPS:
                if op.outputs[0].ref() not in values:  # captured outside the function
                    values[op.outputs[0].ref()] = _Value(_memory_of(op.outputs[0]), False)
                continue
            inputs = [values.get(t.ref(), _Value(DEVICE, False)) for t in op.inputs]
            outputs = self._place_op(op, inputs, where, depth)
            for tensor, value in zip(op.outputs, outputs, strict=True):
                values[tensor.ref()] = value
        return [values.get(t.ref(), _Value(DEVICE, False)) for t in graph.outputs]

    def _place_op(
        self, op: tf.Operation, inputs: list[_Value], where: str, depth: int
    ) -> list[_Value]:
        self.ops_seen += 1
        if op.type in CALL_OPS:
            inner = op.get_attr("f").name
            xla = _must_compile(op) or _must_compile_fn(self._lookup(inner))
            return self.place(self._function(inner), inputs, f"{where}/{inner}", depth, xla)
        if op.type in WHILE_OPS:
            return self._place_while(op, inputs, where, depth)
        if op.type in IF_OPS or op.type in CASE_OPS:
            return self._place_branches(op, inputs, where, depth)
        if op.type in PASS_THROUGH and op.inputs:
            # grappler's dependency optimizer removes identities inside a function body (kept
            # only where they cross devices or feed a Switch): the value stays where it is
            return [dataclasses.replace(inputs[0]) for _ in op.outputs]
        kernel = gpu_kernel(op)
        constant = (
            op.type == "Const"
            or op.type in SHAPE_OPS
            or (not op.op_def.is_stateful and all(v.constant for v in inputs))
        )
        if kernel is None and op.type == "Const" and op.outputs[0].dtype == tf.string:
            return [_Value(HOST, constant) for _ in op.outputs]  # strings: host by design
        if kernel is None:  # falls back to the CPU: every input is copied to the host
            self._report("no-gpu-kernel", op.type, dtypes_of(op), where, depth)
            return [_Value(HOST, constant) for _ in op.outputs]
        host = set(kernel.host_memory_arg)
        in_slots = _arg_slots(op, op.op_def.input_arg)
        if op.type not in SHAPE_OPS:  # a shape op reads no data, whatever its input's memory
            for i, (slot, value) in enumerate(zip(in_slots, inputs, strict=True)):
                wants = (
                    HOST
                    if slot in host or op.inputs[i].dtype.as_datatype_enum in (ALWAYS_ON_HOST)
                    else DEVICE
                )
                self._edge(op, i, value, wants, where, depth)
        out_slots = _arg_slots(op, op.op_def.output_arg)
        return [
            _Value(
                HOST if slot in host or t.dtype.as_datatype_enum in ALWAYS_ON_HOST else DEVICE,
                constant,
            )
            for slot, t in zip(out_slots, op.outputs, strict=True)
        ]

    def _edge(
        self, op: tf.Operation, index: int, value: _Value, wants: str, where: str, depth: int
    ) -> None:
        """A device-memory value into a host-memory input: a copy (reported when data)."""
        if value.memory == DEVICE and wants == HOST and not value.constant and depth > 0:
            tensor = op.inputs[index]
            self._report(
                "device-to-host",
                f"{op.type} input {index}",
                f"{tensor.dtype.name} {tensor.shape} from {tensor.op.type} '{tensor.op.name}'",
                where,
                depth,
            )

    def _place_while(
        self, op: tf.Operation, inputs: list[_Value], where: str, depth: int
    ) -> list[_Value]:
        # Lowered: loop variables pass Enter -> Merge -> Switch -> body -> NextIteration; they
        # live where the GPU Merge kernel of their dtype keeps its output, on entry and when
        # fed back alike. One that the body changes depends on the iteration: not constant.
        cond = self._function(op.get_attr("cond").name)
        body = self._function(op.get_attr("body").name)
        invariant = _passed_through(body)
        carried = [
            _Value(_merge_memory(t.dtype), v.constant and i in invariant)
            for i, (t, v) in enumerate(zip(op.inputs, inputs, strict=True))
        ]
        for i, (t, v) in enumerate(zip(op.inputs, inputs, strict=True)):  # entering the loop
            self._edge(op, i, v, _merge_memory(t.dtype), where, depth)
        name = f"{where}/{op.get_attr('body').name}"
        self.loops.append(name)
        outs = self.place(body, carried, name, depth + 1)
        (pred,) = self.place(cond, carried, f"{where}/{op.get_attr('cond').name}", depth + 1)[:1]
        if pred.memory == DEVICE and not pred.constant:
            self._report(
                "device-to-host",
                "While predicate",
                "the loop condition is computed in device memory; Switch reads it on the host",
                f"{where}/{op.get_attr('cond').name}",
                depth + 1,
            )
        for lv, o in zip(carried, outs, strict=True):
            if lv.memory == HOST and o.memory == DEVICE and not o.constant:
                self._report(
                    "device-to-host",
                    "While loop variable",
                    "a loop variable kept on the host is computed in device memory",
                    name,
                    depth + 1,
                )
        return carried

    def _place_branches(
        self, op: tf.Operation, inputs: list[_Value], where: str, depth: int
    ) -> list[_Value]:
        selector, data = inputs[0], inputs[1:]
        if selector.memory == DEVICE and not selector.constant and depth > 0:
            self._report(
                "device-to-host",
                f"{op.type} predicate",
                f"{op.inputs[0].dtype.name} from {op.inputs[0].op.type} '{op.inputs[0].op.name}'",
                where,
                depth,
            )
        names = (
            [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
            if op.type in IF_OPS
            else [f.name for f in op.get_attr("branches")]
        )
        args = [
            _Value(_merge_memory(t.dtype), v.constant)
            for t, v in zip(op.inputs[1:], data, strict=True)
        ]
        for i, (t, v) in enumerate(zip(op.inputs[1:], data, strict=True), start=1):
            self._edge(op, i, v, _merge_memory(t.dtype), where, depth)  # through a Switch
        results = [self.place(self._function(n), args, f"{where}/{n}", depth) for n in names]
        return [
            _Value(_merge_memory(t.dtype), all(r[i].constant for r in results))
            for i, t in enumerate(op.outputs)
        ]


def _passed_through(body: tf.Graph) -> set[int]:
    """Indices of the loop variables that ``body`` returns unchanged (through identities)."""
    args = [op for op in body.get_operations() if op.type in ARG_OPS]
    same = set()
    for i, out in enumerate(body.outputs):
        while out.op.type in PASS_THROUGH and out.op.inputs:
            out = out.op.inputs[0]
        if i < len(args) and out.op is args[i]:
            same.add(i)
    return same


def _memory_of(tensor: tf.Tensor) -> str:
    return HOST if tensor.dtype.as_datatype_enum in ALWAYS_ON_HOST else DEVICE


@functools.cache
def _merge_memory_enum(dtype_enum: int) -> str:
    for kernel in _kernels("Merge"):
        if kernel.device_type not in GPU_DEVICES:
            continue
        (constraint,) = [c for c in kernel.constraint if c.name == "T"]
        if dtype_enum in constraint.allowed_values.list.type:
            return HOST if "output" in kernel.host_memory_arg else DEVICE
    return HOST


def _merge_memory(dtype: tf.DType) -> str:
    """Where a lowered control-flow value of ``dtype`` lives on a GPU (the Merge kernel's
    output memory: host for int32, resources and strings)."""
    return _merge_memory_enum(dtype.as_datatype_enum)


def _must_compile(op: tf.Operation) -> bool:
    attr = op.node_def.attr.get("_XlaMustCompile")
    return bool(attr is not None and attr.b)


def _must_compile_fn(fdef: Any) -> bool:
    attr = fdef.attr.get("_XlaMustCompile")
    return bool(attr is not None and attr.b)


def _function_attrs(op: tf.Operation) -> list[tuple[str, str]]:
    """``(attr, function name)`` of every function ``op`` calls."""
    return _attr_functions(op.node_def)


def _attr_functions(node_def: Any) -> list[tuple[str, str]]:
    """``(attr, function name)`` of every function a `NodeDef`'s attributes name."""
    found = []
    for key, value in node_def.attr.items():
        if value.HasField("func"):
            found.append((key, value.func.name))
        elif value.HasField("list"):
            found += [(key, f.name) for f in value.list.func]
    return sorted(found)


def _arg_memory(dtype: tf.DType) -> str:
    """Where an argument of a function called from the host lives: int32, resources and strings
    in host memory (TensorFlow's convention for function arguments), the rest on the device."""
    return HOST if dtype == tf.int32 or dtype.as_datatype_enum in ALWAYS_ON_HOST else DEVICE


def _short(name: str) -> str:
    """``train_graph`` of ``__inference__train_graph_123``; eager ops by their type."""
    if name.startswith("__wrapped__"):
        return "eager " + name[len("__wrapped__") :].split("_device_")[0]
    return name.removeprefix("__inference_").rsplit("_", 1)[0].strip("_")


@contextlib.contextmanager
def recorded_functions() -> Iterator[list[str]]:
    """Record the functions and eager ops that the code inside runs for the first time.

    TensorFlow registers every traced ``tf.function`` (``__inference_*``), the bodies and
    branches it calls, and every eager op kind (``__wrapped__*``) with the eager context; the
    names new inside the block are what it ran. Yields the list, filled at the end of the block.
    """
    ctx = context.context()
    before = set(ctx.list_function_names())
    names: list[str] = []
    yield names
    names += sorted(set(ctx.list_function_names()) - before)


def _called(fdef: Any) -> set[str]:
    """The functions a `FunctionDef`'s nodes call."""
    return {name for node in fdef.node_def for _, name in _attr_functions(node)}


def place_recorded(names: Iterable[str]) -> Placement:
    """Place every function of ``names`` (see `recorded_functions`) that no other one calls, as
    its caller on the host ran it; eager ops of tf.data's pipeline (host by design) are left
    out.

    Returns:
        the `Placement` with its findings.
    """
    ctx = context.context()
    names = list(names)
    called = set().union(*(_called(ctx.get_function_def(n)) for n in names)) if names else set()
    placement = Placement(ctx.get_function_def)
    for name in names:
        if name in called:
            continue
        if name.startswith("__wrapped__"):
            op_type = name[len("__wrapped__") :].split("_", 1)[0]
            if "Iterator" in op_type or op_type.endswith(HOST_SUFFIXES):
                continue
        placement.place_function(name)
    return placement


def place_dataset(dataset: tf.data.Dataset) -> Placement:
    """Place the functions a ``tf.data`` pipeline runs (its maps, and what they call); the
    pipeline's own ops run on the host by design."""
    graph_def = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    library = {f.signature.name: f for f in graph_def.library.function}
    called = set().union(*(_called(f) for f in library.values())) if library else set()
    placement = Placement(library.__getitem__)
    for name in sorted(library):
        if name not in called:
            placement.place_function(name)
    return placement


def place_on_gpu(fn: Any, xla: bool = False) -> Placement:
    """Place the concrete function ``fn`` (a traced ``tf.function``) on a GPU; ``xla``: it is
    compiled (``jit_compile=True``)."""
    graph = fn.graph
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    placement = Placement(library.__getitem__)
    args = [_Value(_arg_memory(t.dtype), False) for t in graph.inputs]
    placement.place(graph, args, fn.name, 0, xla)
    return placement
