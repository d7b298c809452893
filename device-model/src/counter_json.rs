//! Counters as the control socket's JSON object, one way for every engine.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

use serde_json::Value;

/// `snapshot` (every counter of a set, in its declaration order) as an object. serde_json's map is a BTreeMap:
/// filled key by key, each insert is a search of string compares, and the dumps of a fuzz input spent a fifth
/// of its time there. From keys already in order the map is built in one pass. `order` is that order for the
/// set the snapshot comes from, worked out on first use.
pub fn to_json(snapshot: &[(&'static str, u64)], order: &OnceLock<Vec<usize>>) -> Value {
    let order = order.get_or_init(|| {
        let mut o: Vec<usize> = (0..snapshot.len()).collect();
        o.sort_by_key(|&i| snapshot[i].0);
        o
    });
    let sorted = order.iter().filter_map(|&i| snapshot.get(i));
    Value::Object(sorted.map(|(k, v)| ((*k).to_owned(), Value::from(*v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_holds_every_counter_by_name_whatever_the_declaration_order() {
        let order = OnceLock::new();
        let snap = [("wqes", 3), ("arms", 1), ("doorbells", 7), ("cqes", 0)];
        let got = to_json(&snap, &order);
        assert_eq!(got, serde_json::json!({"arms": 1, "cqes": 0, "doorbells": 7, "wqes": 3}));
        assert_eq!(got.as_object().unwrap().keys().collect::<Vec<_>>(), ["arms", "cqes", "doorbells", "wqes"]);
        // The order is kept for the set; later snapshots carry new values.
        let snap = [("wqes", 4), ("arms", 2), ("doorbells", 8), ("cqes", 1)];
        assert_eq!(to_json(&snap, &order), serde_json::json!({"arms": 2, "cqes": 1, "doorbells": 8, "wqes": 4}));
    }
}
