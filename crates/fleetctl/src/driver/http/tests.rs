use super::*;

#[test]
fn names_are_asked_for_in_batches_and_no_names_ask_nothing() {
    assert_eq!(name_queries(None), vec![Vec::new()]);
    assert!(name_queries(Some(&BTreeSet::new())).is_empty());
    let names: BTreeSet<UnitName> = (0..1200)
        .map(|i| format!("u{i:04}.service").parse().unwrap())
        .collect();
    let queries = name_queries(Some(&names));
    let sizes: Vec<usize> = queries.iter().map(Vec::len).collect();
    assert_eq!(sizes, [500, 500, 200]);
    assert_eq!(queries[0][0], (wire::UNIT_NAME, "u0000.service".to_owned()));
}

#[test]
fn unit_names_are_escaped_in_paths_but_keep_their_at_sign() {
    assert_eq!(
        unit_path(&"web@1.service".parse().unwrap()),
        "/units/web@1.service"
    );
    assert_eq!(
        unit_path(&"a\\x2db.service".parse().unwrap()),
        "/units/a%5Cx2db.service"
    );
}
