"""Experiment: average the grid weights within a tolerance of the best inner loss (selection smoothing)."""
import math, os, numpy as np
from zmlx_pipeline.models import cv_ensemble, variants
from zmlx_pipeline.models.rankers import base

TOL = float(os.environ.get("AVG_TOL", "0"))

def _select(self, train, split):
    folds = self._inner_folds(train, split)
    if not folds:
        return [1.0 / len(self.member_names)] * len(self.member_names), False, None
    per_fold = []
    for inner_train, inner_test in folds:
        sample = base.fit_sample(inner_train, max_rows=self.inner_rows)
        inner_test = base.fit_sample(cv_ensemble.sample_cases(inner_test, self.inner_cases), max_rows=self.inner_test_rows)
        scores = {m: base.relative_to_case(inner_test, variants.make_ranker(self.features, m).fit(sample).score(inner_test))
                  for m in self._names()}
        regret = cv_ensemble._FoldRegret(inner_test, self.ks)
        hedged = [regret.ranks(scores[h]) for h in self.hedge_names]
        per_fold.append((inner_test, scores, regret, hedged))

    def combined(t, s, w, hedge, regret, hedged):
        total = self._total(t, s, w)
        return cv_ensemble.interleave_ranks([regret.ranks(total), *hedged]) if hedge else total

    results = []
    for hedge in ([False, True] if self.hedge_names else [False]):
        for w in cv_ensemble.weight_grid(len(self.member_names), self.step):
            loss = float(np.mean([regret.mean(combined(t, s, w, hedge, regret, hedged)) for t, s, regret, hedged in per_fold]))
            results.append((loss, hedge, w))
    best_loss = min(r[0] for r in results)
    best = next(r for r in results if r[0] < best_loss + 1e-12)
    hedge = best[1]
    near = [np.array(w) for loss, h, w in results if h == hedge and loss <= best_loss * (1 + TOL) + 1e-12]
    w = list(np.mean(near, axis=0)) if TOL > 0 else list(best[2])
    return w, hedge, best_loss

cv_ensemble.CVEnsembleRanker._select = _select
