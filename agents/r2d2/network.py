"""R2D2's recurrent Q-network and its loops over time, written so XLA can count them.

XLA:GPU runs a ``while`` whose trip count it does not know with a copy of the predicate to the
host and a wait for an idle GPU before every iteration; a loop it counts is queued whole. It
counts a loop whose counter starts at a constant, grows by one and is compared with a constant.
A `tf.scan` nested in the learner's SGD loop reaches XLA with the condition
``and(i < T, i < T)``, which it does not count, and TensorFlow's gradient of any
``tf.while_loop`` takes its bound from the forward loop's counter output, which no form makes a
constant. So here:

- the forward loop is ``tf.while_loop(lambda *_: True, ..., maximum_iterations=T)``: its only
  condition is the counter against the constant T;
- its gradient is written out (`tf.custom_gradient`): backpropagation through time in a second
  loop of the same form, over the gates the forward loop saved, and the recurrent kernel's
  gradient as one product over all steps after it;
- the online and target networks run as one batched cell (a leading network axis ``N``), so an
  R2D2 step runs 2 loops of burn-in + T iterations forward and one of T backward, not 4 + 1;
  the backward loop covers only the ``trained`` leading networks.

`tests/test_loop_trip_counts.py` reads the optimized HLO and checks that every one of these
loops has a known trip count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from ..networks import mlp

#: name of the forward loop over time (``known_trip_count`` in XLA's optimized HLO)
FORWARD_LOOP = "lstm_forward"
#: name of the backward loop over time (backpropagation through time)
BACKWARD_LOOP = "lstm_backward"


def _counted_loop(steps: int, body, loop_vars, name: str):
    """``body(t, *loop_vars)`` for ``t = 0 .. steps - 1``, in a loop XLA counts."""
    out = tf.while_loop(
        lambda *_: True,
        lambda t, *vs: (t + 1, *body(t, *vs)),
        (tf.constant(0, tf.int32), *loop_vars),
        maximum_iterations=steps,
        parallel_iterations=1,
        name=name,
    )
    return out[1:]


def lstm_over_time(
    gates_in: tf.Tensor,
    keep: tf.Tensor,
    h: tf.Tensor,
    c: tf.Tensor,
    recurrent: tf.Tensor,
    trained: int,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """N LSTM cells (gates i, f, g, o) over T steps, as one batched cell.

    Args:
        gates_in: ``[T, N, B, 4U]`` the input half of each step's gate pre-activations (bias
            included).
        keep: ``[T, B, 1]`` bool; where False the state carries over unchanged.
        h, c: ``[N, B, U]`` the initial state.
        recurrent: ``[N, U, 4U]`` each network's recurrent kernel.
        trained: the leading networks whose gradients are wanted (static); the others get zero
            gradients, so pass them through `tf.stop_gradient`.

    Returns:
        ``(outputs [T, N, B, U], h [N, B, U], c [N, B, U])``.
    """
    steps = int(gates_in.shape[0])

    @tf.custom_gradient
    def run(gates_in, h, c, recurrent):
        empty = [tf.TensorArray(tf.float32, size=steps, element_shape=h.shape) for _ in range(3)]
        acts0 = tf.TensorArray(tf.float32, size=steps, element_shape=gates_in.shape[1:])

        def forward(t, h, c, outs, cs, tanhs, acts):
            pre = gates_in[t] + tf.matmul(h, recurrent)
            i, f, g, o = tf.split(pre, 4, axis=2)
            i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
            c_new = f * c + i * g
            tanh_c = tf.tanh(c_new)
            h_new = o * tanh_c
            k = keep[t]
            h_out, c_out = tf.where(k, h_new, h), tf.where(k, c_new, c)
            return (
                h_out,
                c_out,
                outs.write(t, h_out),
                cs.write(t, c_out),
                tanhs.write(t, tanh_c),
                acts.write(t, tf.concat([i, f, g, o], axis=2)),
            )

        h_end, c_end, outs, cs, tanhs, acts = _counted_loop(
            steps, forward, (h, c, *empty, acts0), FORWARD_LOOP
        )
        outputs, cells = outs.stack(), cs.stack()
        # the state before each step: h0 then the outputs (a kept-over step repeats its input)
        h_prev = tf.concat([h[None], outputs[:-1]], axis=0)
        c_prev = tf.concat([c[None], cells[:-1]], axis=0)
        tanh_c, gates = tanhs.stack(), acts.stack()

        def grad(d_outputs, d_h, d_c):
            n = trained
            d_outputs, d_h, d_c = d_outputs[:, :n], d_h[:n], d_c[:n]
            rec, tc, gts, cp = recurrent[:n], tanh_c[:, :n], gates[:, :n], c_prev[:, :n]
            zeros = tf.zeros_like(d_h)
            d_pre0 = tf.TensorArray(tf.float32, size=steps, element_shape=gts.shape[1:])

            def backward(j, d_h, d_c, d_pre):
                t = steps - 1 - j
                dh = d_h + d_outputs[t]
                k = keep[t]
                dh_new, dh_skip = tf.where(k, dh, zeros), tf.where(k, zeros, dh)
                dc_in, dc_skip = tf.where(k, d_c, zeros), tf.where(k, zeros, d_c)
                i, f, g, o = tf.split(gts[t], 4, axis=2)
                dc_new = dc_in + dh_new * o * (1.0 - tc[t] * tc[t])
                step = tf.concat(
                    [
                        dc_new * g * i * (1.0 - i),
                        dc_new * cp[t] * f * (1.0 - f),
                        dc_new * i * (1.0 - g * g),
                        dh_new * tc[t] * o * (1.0 - o),
                    ],
                    axis=2,
                )
                dh_prev = tf.matmul(step, rec, transpose_b=True) + dh_skip
                return dh_prev, dc_new * f + dc_skip, d_pre.write(t, step)

            d_h0, d_c0, d_pre = _counted_loop(steps, backward, (d_h, d_c, d_pre0), BACKWARD_LOOP)
            d_pre = d_pre.stack()  # [T, n, B, 4U]
            d_rec = tf.einsum("tnbu,tnbg->nug", h_prev[:, :n], d_pre)

            def padded(x, axis):  # zeros for the untrained networks
                pad = [[0, 0]] * len(x.shape)
                pad[axis] = [0, int(gates_in.shape[1]) - n]
                return tf.pad(x, pad)

            return padded(d_pre, 1), padded(d_h0, 0), padded(d_c0, 0), padded(d_rec, 0)

        return (outputs, h_end, c_end), grad

    return run(gates_in, h, c, recurrent)


class LSTMQNetwork(tf.Module):
    """A recurrent Q-network: a ReLU dense torso (``torso`` wide), an LSTM cell, a linear Q head.

    Plain variables, so acting can mirror it in numpy (`acting.numpy_lstm_step`). The state is
    one ``[B, 2 * units]`` float32 tensor, ``concat([h, c])`` (one table field). Initialisation:
    PyTorch-like uniform bounds, forget-gate bias 1.

    ``loop``: unroll in a counted loop over time (`lstm_over_time`), which XLA compiles in
    seconds at any length (a static unroll of R2D2's 120 steps took 407 s). Without XLA, set it
    False: the static unroll is one graph of L cells, where TensorFlow's own executor would
    run a loop's iterations one by one.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        torso: int,
        units: int,
        seed: int,
        loop: bool = True,
        name: str = "lstm",
    ) -> None:
        super().__init__(name=name)
        self.units = int(units)
        self.loop = loop
        self.torso = mlp([obs_dim, torso], seed=seed, name=f"{name}_torso")
        rng = tf.random.Generator.from_seed(seed + 1)
        bound = 1.0 / np.sqrt(self.units)
        self.kernel = tf.Variable(rng.uniform([torso + self.units, 4 * self.units], -bound, bound))
        forget = np.zeros(4 * self.units, np.float32)
        forget[self.units : 2 * self.units] = 1.0  # gates i, f, g, o: remember by default
        self.bias = tf.Variable(forget, name="bias")
        self.head = mlp([self.units, num_actions], seed=seed + 2, name=f"{name}_head")

    @property
    def state_size(self) -> int:
        """Width of the recurrent state, ``2 * units`` (h then c)."""
        return 2 * self.units

    @property
    def weights(self) -> list[tf.Variable]:
        """``[torso w, torso b, kernel, bias, head w, head b]``."""
        return [*self.torso.weights, self.kernel, self.bias, *self.head.weights]

    def gates_in(self, obs: tf.Tensor) -> tf.Tensor:
        """``[B, L, D] -> [B, L, 4U]``: the input half of every step's gate pre-activations, in
        one product."""
        batch, steps = tf.shape(obs)[0], obs.shape[1]
        x = tf.nn.relu(self.torso(tf.reshape(obs, [batch * steps, -1])))
        return tf.reshape(tf.matmul(x, self.kernel[: -self.units]) + self.bias, [batch, steps, -1])

    def q_values(self, outputs: tf.Tensor) -> tf.Tensor:
        """``[B, L, U] -> [B, L, A]``: the head on every step's output."""
        batch, steps = tf.shape(outputs)[0], outputs.shape[1]
        q = self.head(tf.reshape(outputs, [batch * steps, self.units]))
        return tf.reshape(q, [batch, steps, -1])

    def unroll(
        self, obs: tf.Tensor, state: tf.Tensor, mask: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Q-values of a sequence: ``[B, L, D], [B, 2U] -> ([B, L, A], final state [B, 2U])``.
        Where ``mask`` ``[B, L]`` is 0 the state carries over, so padding before a window's
        first real step leaves the stored state as it was."""
        (q,), (final,) = unroll_together([self], obs, [state], mask, trained=1)
        return q, final

    def get_weights(self) -> list[np.ndarray]:
        """A numpy copy of ``weights`` for acting (`acting.numpy_lstm_step`), named as Keras's."""
        return [v.numpy() for v in self.weights]


def unroll_together(
    nets: Sequence[LSTMQNetwork],
    obs: tf.Tensor,
    states: Sequence[tf.Tensor],
    mask: tf.Tensor | None,
    trained: int,
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Several networks of one shape over the same ``[B, L, D]`` sequence, each from its own
    ``[B, 2U]`` state, as one batched cell (`lstm_over_time`) when they loop; ``([B, L, A] per
    net, final [B, 2U] per net)``. Gradients reach only the first ``trained`` networks: the
    others' inputs are stopped. Where ``mask`` ``[B, L]`` is 0 the state carries over."""
    units, batch, steps = nets[0].units, tf.shape(obs)[0], obs.shape[1]
    keep = (mask if mask is not None else tf.ones([batch, steps])) > 0

    def stop(i: int, x: tf.Tensor) -> tf.Tensor:
        return x if i < trained else tf.stop_gradient(x)

    gates = [stop(i, net.gates_in(obs)) for i, net in enumerate(nets)]
    hs = [stop(i, s[:, :units]) for i, s in enumerate(states)]
    cs = [stop(i, s[:, units:]) for i, s in enumerate(states)]
    recurrent = [stop(i, net.kernel[-units:]) for i, net in enumerate(nets)]
    if nets[0].loop:
        outputs, h, c = lstm_over_time(
            tf.transpose(tf.stack(gates), [2, 0, 1, 3]),  # [L, N, B, 4U]
            tf.transpose(keep)[:, :, None],
            tf.stack(hs),
            tf.stack(cs),
            tf.stack(recurrent),
            trained,
        )
        each = tf.unstack(tf.transpose(outputs, [1, 2, 0, 3]))  # N x [B, L, U]
        finals = [tf.concat([h[i], c[i]], axis=1) for i in range(len(nets))]
    else:
        each, finals = [], []
        for g, h, c, rec in zip(gates, hs, cs, recurrent, strict=True):
            out = []
            for t in range(steps):  # static L: L cells in the graph
                h, c = _cell(h, c, g[:, t], keep[:, t : t + 1], rec)
                out.append(h)
            each.append(tf.stack(out, axis=1))
            finals.append(tf.concat([h, c], axis=1))
    return [net.q_values(o) for net, o in zip(nets, each, strict=True)], finals


def _cell(
    h: tf.Tensor, c: tf.Tensor, gates: tf.Tensor, keep: tf.Tensor, recurrent: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """One LSTM step of the static unroll: ``[B, U] x 2, [B, 4U], [B, 1] bool -> [B, U] x 2``."""
    i, f, g, o = tf.split(gates + tf.matmul(h, recurrent), 4, axis=1)
    c_new = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
    h_new = tf.sigmoid(o) * tf.tanh(c_new)
    return tf.where(keep, h_new, h), tf.where(keep, c_new, c)
