#!/usr/bin/env python3
"""Why the eager update loses where one DiLoCo round moves the model most of the way: a scalar
model of the outer loop (docs/training.md, "Overlap").

Every worker alike; H inner steps contract the distance to the optimum by c per round
(θ_end − θ* = c·(θ_start − θ*)); the outer SGD with Nesterov momentum steps θ_g with the
round's pseudo-gradient Δ = θ_start − θ_end. Printed: |θ_g − θ*| after T rounds (start 1) with
no overlap, the delayed update (lowcomm.diloco overlap="delayed": apply the previous round's
average, restart from θ_g minus the own progress on the wire) and the eager update (Kale et
al. 2025: Δ̄(t−1) + (Δ_m(t) − Δ_m(t−1))/M, restart from θ_g).

    python3 examples/overlap_scalar_model.py
"""


def distance(mode, c, workers=4, lr=0.7, momentum=0.9, rounds=6):
    g, buf = 1.0, None

    def outer(grad):
        nonlocal g, buf
        buf = grad if buf is None else momentum * buf + grad
        g -= lr * (grad + momentum * buf)

    start, pending, prev = g, None, None
    for _ in range(rounds):
        delta = start - c * start  # the round's pseudo-gradient
        if mode == "none":
            outer(delta)
            start = g
        elif mode == "delayed":
            if pending is not None:
                outer(pending)
            start, pending = g - delta, delta
        else:  # eager: every worker alike, so the others' average is its own
            outer(delta / workers if prev is None else prev + (delta - prev) / workers)
            start, prev = g, delta
    if mode == "delayed":
        outer(pending)
    elif mode == "eager":
        outer(prev - prev / workers)
    return abs(g)


def main():
    print("contraction c per round | rounds | no overlap | delayed | eager")
    for c in (0.1, 0.5, 0.9, 0.98):
        for rounds in (6, 30):
            print(f"{c:23} | {rounds:6} | " + " | ".join(
                f"{distance(m, c, rounds=rounds):.3g}" for m in ("none", "delayed", "eager")))
    # A network has directions of every speed: those its H inner steps settle (c near 0) make
    # the eager update grow where the outer momentum amplifies the stale part of its step.
    print()
    print("eager, 60 rounds: distance by outer (lr, momentum) and c (> 1: diverging)")
    cs = (0.0, 0.1, 0.3, 0.5, 0.9)
    print(f"{'lr, momentum':12} | " + " | ".join(f"{f'c = {c}':8}" for c in cs))
    for lr, momentum in ((0.7, 0.9), (0.35, 0.9), (0.7, 0.7), (0.7, 0.5), (0.7, 0.0)):
        print(f"{f'{lr}, {momentum}':12} | " + " | ".join(
            f"{distance('eager', c, lr=lr, momentum=momentum, rounds=60):<8.2g}" for c in cs))


if __name__ == "__main__":
    main()
