"""
A contextual bandit: Thompson sampling against ε-greedy
=======================================================

Each round, five candidate items arrive, each a feature row; we show one and see a click
(1) or not, with probability ``σ(x·θ* + b*)`` for an unknown ``θ*``. The regret of a round
is the best candidate's click probability minus the shown one's.

*Thompson sampling* with vsbayes: draw coefficients from the posterior, score the
candidates with that draw, show the best (``thompson_sample`` does both in one call), and
update the posterior with the clicks by ``partial_fit`` — assumed-density filtering, the
posterior of the rounds so far is the prior of the next batch (each batch fitted jointly
with a window of the last 100 rows, ``buffer_size``), at a cost that does not grow with
the rounds seen. Uncertain items get shown while they might be the best; the
exploration stops by itself as the posterior narrows.

*ε-greedy* with scikit-learn's ``LogisticRegression``: show the item of highest predicted
click probability, or a random one with probability ε = 0.1, refitting on every round so
far. Both update every 10 rounds (a batched bandit, as in practice), from the first batch
that has seen a click and a miss: a stream whose first rows are all of one class leaves a
one-sided posterior, which ``partial_fit`` warns of. The curves are the mean
cumulative regret over 20 seeds, with one standard error.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

import vsbayes

N_ARMS, N_FEATURES, ROUNDS, BATCH, EPSILON = 5, 6, 400, 10, 0.1


def environment(seed: int):
    """The unknown coefficients and each round's candidate rows."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=N_FEATURES)
    contexts = rng.normal(size=(ROUNDS, N_ARMS, N_FEATURES))
    return theta, -1.0, contexts, rng


def click_probability(rows, theta, intercept):
    return 1.0 / (1.0 + np.exp(-(rows @ theta + intercept)))


def run(policy: str, seed: int, rounds: int = ROUNDS) -> np.ndarray:
    """The cumulative regret of one policy ("thompson" or "epsilon") on one seed."""
    theta, intercept, contexts, rng = environment(seed)
    model = vsbayes.LaplaceLogisticRegression()
    shown, clicks, regret = [], [], np.zeros(rounds)
    pending, start = 0, 0  # rows not yet in the model; the first of them
    fitted = False
    for t in range(rounds):
        rows = contexts[t]
        if policy == "thompson" and fitted:
            scores = model.thompson_sample(rows, random_state=rng).scores[0]
            arm = int(np.argmax(scores))
        elif policy == "epsilon" and fitted and rng.random() >= EPSILON:
            arm = int(np.argmax(model.predict_proba(rows)[:, 1]))
        else:  # explore (or nothing fitted yet)
            arm = int(rng.integers(N_ARMS))
        p = click_probability(rows, theta, intercept)
        regret[t] = p.max() - p[arm]
        shown.append(rows[arm])
        clicks.append(int(rng.random() < p[arm]))
        pending += 1
        if pending == BATCH:
            if policy == "thompson" and len(set(clicks)) == 2:  # the new rows only
                model.partial_fit(np.array(shown[start:]), clicks[start:], classes=[0, 1])
                start, fitted = len(shown), True
            elif len(set(clicks)) == 2:  # every row so far
                model = LogisticRegression().fit(np.array(shown), clicks)
                fitted = True
            pending = 0
    return np.cumsum(regret)


if __name__ == "__main__":
    seeds = range(20)
    # Fits of a few hundred rows: one BLAS thread is the fastest (threads only contend).
    with threadpool_limits(limits=1):
        curves = {
            "Thompson sampling (vsbayes, partial_fit)": np.array(
                [run("thompson", s) for s in seeds]
            ),
            f"ε-greedy LogisticRegression (ε = {EPSILON})": np.array(
                [run("epsilon", s) for s in seeds]
            ),
        }
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, regret in curves.items():
        mean = regret.mean(axis=0)
        error = regret.std(axis=0, ddof=1) / np.sqrt(len(regret))
        rounds = np.arange(1, len(mean) + 1)
        ax.plot(rounds, mean, label=label)
        ax.fill_between(rounds, mean - error, mean + error, alpha=0.25)
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative regret (mean of 20 seeds)")
    ax.legend()
    fig.tight_layout()
    plt.show()

    thompson, greedy = (regret[:, -1] for regret in curves.values())
    root_n = np.sqrt(len(seeds))
    print(
        f"final regret: Thompson {thompson.mean():.1f} ± {thompson.std(ddof=1) / root_n:.1f}, "
        f"ε-greedy {greedy.mean():.1f} ± {greedy.std(ddof=1) / root_n:.1f}; Thompson lower "
        f"on {int((thompson < greedy).sum())} of {len(seeds)} seeds"
    )
