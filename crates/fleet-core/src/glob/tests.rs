use super::*;
use proptest::prelude::*;

#[test]
fn matches_like_go_path_match() {
    let table: &[(&str, &str, bool)] = &[
        ("web.service", "web.service", true),
        ("web.service", "web.socket", false),
        ("", "", true),
        ("", "a", false),
        // `*` spans any run but `/`.
        ("*", "", true),
        ("*", "web@1.service", true),
        ("*", "a/b", false),
        ("web@*.service", "web@1.service", true),
        ("web@*.service", "web@.service", true),
        ("web@*.service", "db@1.service", false),
        ("*.service", "web.socket", false),
        ("*@*", "web@1.service", true),
        ("a*/b", "abc/b", true),
        ("a*/b", "a/c/b", false),
        ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
        ("a*b?c*x", "abxbbxdbxebxczzx", true),
        ("a*b?c*x", "abxbbxdbxebxczzy", false),
        ("**x", "xxx", true),
        ("*x", "xxx", true),
        // `?` is one character but `/`.
        ("web@?.service", "web@1.service", true),
        ("web@?.service", "web@10.service", false),
        ("a?b", "a/b", false),
        ("a?b", "a\u{263a}b", true),
        ("a???b", "a\u{263a}b", false),
        // Classes, ranges and negation.
        ("web@[0-9].service", "web@7.service", true),
        ("web@[0-9].service", "web@x.service", false),
        ("web@[^0-9].service", "web@x.service", true),
        ("web@[^0-9].service", "web@7.service", false),
        ("ab[c]", "abc", true),
        ("ab[b-d]", "abc", true),
        ("ab[e-g]", "abc", false),
        ("ab[^b-d]", "abc", false),
        ("ab[^e-g]", "abc", true),
        ("[a-cx-z]", "y", true),
        ("[a-cx-z]", "m", false),
        ("[\\]a]", "]", true),
        ("[\\-]", "-", true),
        ("[x\\-]", "-", true),
        ("[x\\-]", "z", false),
        ("[\\-x]", "x", true),
        ("a[^a]b", "a\u{263a}b", true),
        ("[a-\u{3b6}]*", "\u{3b1}", true),
        ("[/]", "/", true),
        ("[^/]", "/", false),
        ("[*]", "*", true),
        ("a[*]*", "a*bc", true),
        // `\` escapes.
        ("a\\*b", "a*b", true),
        ("a\\*b", "axb", false),
        ("a\\?b", "a?b", true),
        ("a\\?b", "axb", false),
        ("\\a\\b", "ab", true),
        ("web\\@1.service", "web@1.service", true),
    ];
    for (pattern, name, want) in table {
        assert_eq!(
            glob_match(pattern, name),
            *want,
            "{pattern:?} against {name:?}"
        );
    }
}

#[test]
fn malformed_patterns_match_nothing() {
    let table: &[(&str, &str)] = &[
        ("[]a]", "]"),
        ("[]a]", "a"),
        ("[-]", "-"),
        ("[x-]", "x"),
        ("[x-]", "-"),
        ("[-x]", "x"),
        ("[a-b-c]", "a"),
        ("[", "["),
        ("[^", "a"),
        ("[^bc", "a"),
        ("a[", "a"),
        ("a[", "ab"),
        ("\\", "\\"),
        ("web\\", "web\\"),
        ("*[", "x"),
        ("*x[", "x"),
        // The bad part comes after a part that already failed: still no match, still bad.
        ("b*[", "a"),
        ("a/b[", "x"),
    ];
    for (pattern, name) in table {
        assert!(!glob_match(pattern, name), "{pattern:?} against {name:?}");
        assert!(matches(pattern, name).is_err(), "{pattern:?} is malformed");
    }
}

proptest! {
    #[test]
    fn a_name_without_special_characters_matches_itself(name in "[a-zA-Z0-9:_.@-]{0,30}") {
        prop_assert!(glob_match(&name, &name));
        prop_assert!(glob_match("*", &name));
    }

    #[test]
    fn an_escaped_name_matches_exactly_itself(name in "\\PC{0,12}", other in "\\PC{0,12}") {
        let escaped: String = name.chars().flat_map(|c| ['\\', c]).collect();
        prop_assert!(glob_match(&escaped, &name));
        prop_assert_eq!(glob_match(&escaped, &other), name == other);
    }

    #[test]
    fn matching_never_panics(pattern in "[a*?\\[\\]^\\\\/-]{0,12}", name in "[a/\\]*-]{0,8}") {
        let _ = glob_match(&pattern, &name);
    }
}
