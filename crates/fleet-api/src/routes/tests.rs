use super::*;

#[test]
fn paths_name_resources_under_both_prefixes() {
    for prefix in PREFIXES {
        let p = |s: &str| format!("{prefix}{s}");
        assert_eq!(parse_path(&p("")), Some(Route::Root));
        assert_eq!(parse_path(&p("/units")), Some(Route::Units));
        assert_eq!(
            parse_path(&p("/units/a@1.service")),
            Some(Route::Unit("a@1.service"))
        );
        assert_eq!(
            parse_path(&p("/state/a.service")),
            Some(Route::State("a.service"))
        );
        assert_eq!(parse_path(&p("/units/")), None);
        assert_eq!(parse_path(&p("/units/a/b")), None);
        assert_eq!(parse_path(&p("/")), None);
        assert_eq!(parse_path(&p("/unitsx")), None);
    }
    assert_eq!(parse_path("/"), Some(Route::Root));
    assert_eq!(parse_path("/fleet/v2/units"), None);
}

#[test]
fn query_values_decode_like_go() {
    let q = "nextPageToken=ZAACAA==&unitName=a%40b.service&x=1+2&unitName=c";
    assert_eq!(query_values(q, "nextPageToken"), vec!["ZAACAA=="]);
    assert_eq!(query_values(q, "unitName"), vec!["a@b.service", "c"]);
    assert_eq!(query_values(q, "x"), vec!["1 2"]);
    assert!(query_values(q, "machineID").is_empty());
}
