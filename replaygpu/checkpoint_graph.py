"""A checkpoint's saved object graph beside the live objects, read without restoring: what
`replaygpu.Checkpointer` checks before a restore writes anything. Values are keyed by child-name
paths (``learner/table/storage/x/.ATTRIBUTES/VARIABLE_VALUE``), graph in
``_CHECKPOINTABLE_OBJECT_GRAPH``; a restore matches live to saved objects by walking both.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2


def mismatched_variables(root: Any, reader: Any) -> list[str]:
    """Live variables whose saved value has another shape or dtype, as readable lines (matched
    by child name, as a restore matches them); ``reader`` from `tf.train.load_checkpoint`."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    view = tf.train.TrackableView(root)
    found: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[Any, int, str]] = [(root, 0, "")]
    while stack:
        live, node_id, path = stack.pop()
        if id(live) in seen:
            continue
        seen.add(id(live))
        node = graph.nodes[node_id]
        variable = as_variable(live)
        if variable is not None:
            for attr in node.attributes:
                key = attr.checkpoint_key
                if attr.name != "VARIABLE_VALUE" or key not in shapes:
                    continue
                want = (variable.shape.as_list(), variable.dtype.name)
                got = (list(shapes[key]), dtypes[key].name)
                if want != got:
                    keras_path = f" ({live.path})" if live is not variable else ""  # layer/kernel
                    found.append(f"'{path}'{keras_path}: live {want}, saved {got}")
        saved = {child.local_name: child.node_id for child in node.children}
        for name, child in view.children(live).items():
            if name in saved:
                stack.append((child, saved[name], f"{path}/{name}" if path else name))
    return sorted(found)


def object_paths(root: Any, targets: list[Any]) -> dict[int, str]:
    """``{id(target): "its/checkpoint/path/"}`` for ``targets`` reachable from ``root``."""
    view = tf.train.TrackableView(root)
    wanted = {id(t) for t in targets}
    found: dict[int, str] = {}
    queue: list[tuple[Any, str]] = [(root, "")]
    seen: set[int] = set()
    while queue and len(found) < len(wanted):
        obj, path = queue.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in wanted:
            found[id(obj)] = path
        for name, child in view.children(obj).items():
            queue.append((child, f"{path}{name}/"))
    return found


def variables_of(obj: Any) -> list[tf.Variable]:
    """Every variable reachable from ``obj`` through checkpoint dependencies, Keras 3's included
    (as the `tf.Variable` each holds)."""
    found = (as_variable(v) for v in tf.train.TrackableView(obj).descendants())
    return [v for v in found if v is not None]


def as_variable(obj: Any) -> tf.Variable | None:
    """``obj`` if it is a `tf.Variable`; the `tf.Variable` a Keras 3 variable keeps its value in
    (a Keras variable is no `tf.Variable`, yet a checkpoint saves it as one); else None."""
    if isinstance(obj, tf.Variable):
        return obj
    value = getattr(obj, "value", None) if type(obj).__module__.startswith("keras") else None
    return value if isinstance(value, tf.Variable) else None
