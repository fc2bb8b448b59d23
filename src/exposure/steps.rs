//! Query understanding for multi-step tasks: a task is split into its steps, each step is
//! ranked on its own, and the rankings are fused by taking each tool's best score, so that a
//! tool one step plainly needs is not outranked by the tools of the task's main step
//! (Complete@20: every needed tool in the 20).
//!
//! Splitting ([`split`]) is by sentence ends (`.`, `?`, `!`, `;`, but not `e.g.`, `i.e.`,
//! `etc.`, `vs.`), line breaks and the connectives `then`, `and then`, `after that`,
//! `afterwards`, `finally`, `and finally`, `and also`; a piece of fewer than
//! [`MIN_STEP_WORDS`] words is joined to its neighbour (a step that short would rank noise);
//! at most [`MAX_STEPS`] steps are kept (the rest is joined to the last). A task of one step
//! is ranked as before.

/// The most steps a task is split into.
pub const MAX_STEPS: usize = 4;
/// The fewest words of a step of its own.
pub const MIN_STEP_WORDS: usize = 3;

const CONNECTIVES: [&str; 7] = ["and then", "after that", "and finally", "and also", "then", "afterwards", "finally"];
const ABBREVIATIONS: [&str; 4] = ["e.g.", "i.e.", "etc.", "vs."];

/// The task's steps (one element: not a multi-step task).
pub fn split(task: &str) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut words = task.split_whitespace().peekable();
    while let Some(word) = words.next() {
        let lower = word.to_lowercase();
        let two = words.peek().map(|n| format!("{lower} {}", n.to_lowercase().trim_end_matches(',')));
        if two.as_deref().is_some_and(|t| CONNECTIVES.contains(&t)) {
            words.next();
            pieces.push(current.join(" "));
            current.clear();
            continue;
        }
        if CONNECTIVES.contains(&lower.trim_end_matches(',')) {
            pieces.push(current.join(" "));
            current.clear();
            continue;
        }
        current.push(word);
        if word.ends_with(['.', '?', '!', ';']) && !ABBREVIATIONS.contains(&lower.as_str()) {
            pieces.push(current.join(" "));
            current.clear();
        }
    }
    pieces.push(current.join(" "));
    // Join short pieces to their neighbour: to the one before, or (the first) to the next.
    let mut steps: Vec<String> = Vec::new();
    let mut carry = String::new();
    for piece in pieces.into_iter().map(|p| p.trim_matches(|c: char| c == ',' || c.is_whitespace()).to_owned()) {
        if piece.is_empty() {
            continue;
        }
        let piece = if carry.is_empty() { piece } else { format!("{} {piece}", std::mem::take(&mut carry)) };
        if piece.split_whitespace().count() >= MIN_STEP_WORDS {
            steps.push(piece);
        } else if let Some(last) = steps.last_mut() {
            last.push(' ');
            last.push_str(&piece);
        } else {
            carry = piece;
        }
    }
    if !carry.is_empty() {
        steps.push(carry);
    }
    if steps.len() > MAX_STEPS {
        let rest = steps.split_off(MAX_STEPS - 1).join(" ");
        steps.push(rest);
    }
    if steps.is_empty() {
        steps.push(task.trim().to_owned());
    }
    steps
}

/// Each candidate's best score over the whole task's ranking and the steps' rankings (all
/// of equal length).
pub fn fuse_max(rankings: &[Vec<f64>]) -> Vec<f64> {
    let n = rankings.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| {
            rankings.iter().filter_map(|r| r.get(i).copied()).filter(|s| !s.is_nan()).fold(f64::NEG_INFINITY, f64::max)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_sentences_and_connectives() {
        assert_eq!(
            split("Read the file README.md and then search for the word grant. Finally send the summary by mail"),
            vec!["Read the file README.md", "search for the word grant.", "send the summary by mail"]
        );
        assert_eq!(split("what is the weather in Lyon"), vec!["what is the weather in Lyon"]);
        assert_eq!(split("x"), vec!["x"]);
        assert_eq!(split("a b c. d e f. g h i. j k l. m n o. p q r").len(), MAX_STEPS);
        assert_eq!(split("Read it. Then grep for TODO in src"), vec!["Read it. grep for TODO in src"]);
    }

    #[test]
    fn fuses_by_the_best_score() {
        assert_eq!(fuse_max(&[vec![0.1, 0.9], vec![0.8, 0.2]]), vec![0.8, 0.9]);
    }
}
