//! Quality of click predictions: AUC and log loss, the two numbers CTR models report.

/// Area under the ROC curve of `scores` against 0/1 `labels`: the probability that a
/// random click scores above a random non-click, ties counting one half (the
/// Mann–Whitney statistic). `None` when the labels are all one class.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    assert_eq!(scores.len(), labels.len(), "one label per score");
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let positives = labels.iter().filter(|&&l| l > 0.5).count();
    let negatives = labels.len() - positives;
    if positives == 0 || negatives == 0 {
        return None;
    }
    // Sum of the (1-based, tie-averaged) ranks of the positives.
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let mid = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += mid * order[i..=j].iter().filter(|&&k| labels[k] > 0.5).count() as f64;
        i = j + 1;
    }
    let (p, n) = (positives as f64, negatives as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// Mean negative log-likelihood of 0/1 `labels` under click probabilities `p` (clamped
/// away from 0 and 1 so a confident mistake costs a finite amount).
pub fn log_loss(p: &[f32], labels: &[f32]) -> f64 {
    assert_eq!(p.len(), labels.len(), "one label per probability");
    let eps = 1e-7;
    let total: f64 = p
        .iter()
        .zip(labels)
        .map(|(&p, &l)| {
            let p = f64::from(p).clamp(eps, 1.0 - eps);
            if l > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum();
    total / p.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AUC by its definition: every (click, non-click) pair.
    fn auc_by_pairs(s: &[f32], l: &[f32]) -> f64 {
        let (mut wins, mut pairs) = (0.0, 0.0);
        for i in 0..s.len() {
            for j in 0..s.len() {
                if l[i] > 0.5 && l[j] < 0.5 {
                    pairs += 1.0;
                    wins += if s[i] > s[j] {
                        1.0
                    } else if s[i] == s[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        wins / pairs
    }

    #[test]
    fn auc_matches_its_definition_with_ties() {
        let s = [0.1, 0.4, 0.35, 0.8, 0.4, 0.4, 0.05, 0.9, 0.35];
        let l = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
        let got = auc(&s, &l).unwrap();
        assert!((got - auc_by_pairs(&s, &l)).abs() < 1e-12, "{got}");
        assert_eq!(auc(&[0.2, 0.9], &[0.0, 1.0]), Some(1.0));
        assert_eq!(auc(&[0.2, 0.9], &[1.0, 1.0]), None);
    }

    #[test]
    fn log_loss_of_a_coin_is_ln_2() {
        let got = log_loss(&[0.5, 0.5], &[0.0, 1.0]);
        assert!((got - std::f64::consts::LN_2).abs() < 1e-12);
        assert!(log_loss(&[0.0], &[1.0]).is_finite());
    }
}
