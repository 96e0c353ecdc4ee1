use super::*;
use proptest::prelude::*;

fn parse(text: &str) -> UnitFile {
    UnitFile::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn triples(unit: &UnitFile) -> Vec<(&str, &str, &str)> {
    unit.options()
        .iter()
        .map(|o| (o.section.as_str(), o.name.as_str(), o.value.as_str()))
        .collect()
}

#[test]
fn hashes_match_fleets_own_vectors() {
    let hello =
        "[Service]\nExecStart=/bin/bash -c \"while true; do echo Hello, World!; sleep 1; done\"\n";
    let unit = UnitFile::parse(hello.as_bytes()).unwrap();
    assert_eq!(
        unit.hash().to_string(),
        "3750b3e9f3962a56c7582929426e9abb012754cf"
    );
    assert_eq!(unit.hash().short(), "3750b3e");

    let example = "[Unit]\nDescription=Hello World\n\n[Service]\nExecStart=/bin/bash -c \"while true; do echo \\\"Hello, world\\\"; sleep 1; done\"\n";
    let unit = UnitFile::parse(example.as_bytes()).unwrap();
    assert_eq!(
        unit.hash().to_string(),
        "e55c0aeb44ba0b68004ceb8a200e685194448b45"
    );
}

#[test]
fn drops_comments_and_blank_lines() {
    let unit = parse(
        "# leading comment\n; another\n\n[Unit]\n  # indented comment\nDescription=x # not a comment\n\n\n;Foo=bar\n[Service]\nExecStart=/bin/true\n",
    );
    assert_eq!(
        triples(&unit),
        [
            ("Unit", "Description", "x # not a comment"),
            ("Service", "ExecStart", "/bin/true"),
        ]
    );
}

#[test]
fn trims_names_and_values() {
    let unit = parse("[Unit]\n   Description   =   spaced out  \t\nAfter=\n");
    assert_eq!(
        triples(&unit),
        [("Unit", "Description", "spaced out"), ("Unit", "After", "")]
    );
}

#[test]
fn keeps_continuations_as_backslash_newline() {
    let unit = parse("[Service]\nExecStart=/bin/sh -c \\\n  'echo a; \\\n   echo b'\nUser=core\n");
    assert_eq!(
        triples(&unit),
        [
            (
                "Service",
                "ExecStart",
                "/bin/sh -c \\\n  'echo a; \\\n   echo b'"
            ),
            ("Service", "User", "core"),
        ]
    );
}

#[test]
fn treats_continuations_like_go_systemd_at_the_edges() {
    let table: &[(&str, &str)] = &[
        // A blank continuation line ends the value and leaves its newline.
        ("[S]\nA=x\\\n\nB=y\n", "x\\\n"),
        ("[S]\nA=x\\\n   \nB=y\n", "x\\\n"),
        // So does the end of the file, with or without the backslash line's newline.
        ("[S]\nA=x\\\n", "x\\\n"),
        ("[S]\nA=x\\", "x\\\n"),
        ("[S]\nA=x\\\ny\\", "x\\\ny\\\n"),
        // A CRLF line ending in `\` continues nothing, but what fleet stores does.
        ("[S]\r\nA=x\\\r\n", "x\\\n"),
        // A continued line is taken as it is, comment marks and brackets included.
        ("[S]\nA=x\\\n# y\nB=y\n", "x\\\n# y"),
        ("[S]\nA=x\\\n[T]\n", "x\\\n[T]"),
        // A CRLF line ending in `\` continues nothing: its next line is an option of its own,
        // until fleet reads back the text it stored, where the value continues onto it.
        ("[S]\r\nA=x\\\r\ny=z\r\n", "x\\\ny=z"),
    ];
    for (text, want) in table {
        let unit = parse(text);
        assert_eq!(unit.options()[0].value, *want, "{text:?}");
    }
}

#[test]
fn lets_a_comment_continue_onto_the_next_line() {
    let unit = parse("[S]\n# comment \\\nHidden=yes\n#two \\ \nHidden=too\nShown=yes\n");
    assert_eq!(triples(&unit), [("S", "Shown", "yes")]);
}

#[test]
fn keeps_repeated_keys_in_order() {
    let unit = parse("[Unit]\nAfter=a\nAfter=b\nRequires=c\nAfter=d\n");
    assert_eq!(
        unit.values("Unit", "After").collect::<Vec<_>>(),
        ["a", "b", "d"]
    );
    assert_eq!(
        unit.canonical(),
        "[Unit]\nAfter=a\nAfter=b\nRequires=c\nAfter=d\n"
    );
}

#[test]
fn merges_repeated_section_headers_in_order_of_first_appearance() {
    let unit = parse("[A]\nx=1\n[B]\ny=2\n[A]\nz=3\n");
    assert_eq!(unit.canonical(), "[A]\nx=1\nz=3\n\n[B]\ny=2\n");
}

#[test]
fn forgets_sections_without_options() {
    let unit = parse("[Empty]\n# nothing\n[Unit]\nDescription=d\n[AlsoEmpty]\n");
    assert_eq!(unit.canonical(), "[Unit]\nDescription=d\n");
    assert!(!unit.has_section("Empty"));
    assert!(unit.has_section("Unit"));
    assert_eq!(unit.description(), Some("d"));
}

#[test]
fn reads_crlf_files_like_lf_files() {
    let crlf = parse("[Unit]\r\nDescription=d\r\n\r\n[Service]\r\nExecStart=/bin/true\r\n");
    let lf = parse("[Unit]\nDescription=d\n\n[Service]\nExecStart=/bin/true\n");
    assert_eq!(crlf, lf);
    assert_eq!(crlf.hash(), lf.hash());
}

#[test]
fn writes_one_blank_line_between_sections_and_ends_with_one_newline() {
    let unit = parse(
        "\n\n[Unit]\nDescription=d\n\n\n\n[Service]\nExecStart=/bin/true\n\n\n[X-Fleet]\nGlobal=true\n\n\n",
    );
    let text = unit.canonical();
    assert_eq!(
        text,
        "[Unit]\nDescription=d\n\n[Service]\nExecStart=/bin/true\n\n[X-Fleet]\nGlobal=true\n"
    );
    assert!(text.ends_with('\n') && !text.ends_with("\n\n"));
}

#[test]
fn compares_equal_exactly_when_the_hashes_do() {
    let interleaved = parse("[A]\nx=1\n[B]\ny=2\n[A]\nz=3\n");
    let grouped = parse("[A]\nx=1\nz=3\n[B]\ny=2\n");
    let reordered = parse("[A]\nz=3\nx=1\n[B]\ny=2\n");
    let sections_swapped = parse("[B]\ny=2\n[A]\nx=1\nz=3\n");
    assert_eq!(interleaved, grouped);
    assert_eq!(interleaved.hash(), grouped.hash());
    for other in [&reordered, &sections_swapped] {
        assert_ne!(&grouped, other);
        assert_ne!(grouped.hash(), other.hash());
    }
}

#[test]
fn hash_ignores_formatting_but_not_content() {
    let a = parse("[Unit]\nDescription=d\n[Service]\nExecStart=/bin/true\n");
    let b = parse("# c\n[Unit]\n  Description = d  \n\n\n[Service]\r\nExecStart=/bin/true");
    let c = parse("[Unit]\nDescription=e\n[Service]\nExecStart=/bin/true\n");
    assert_eq!(a.hash(), b.hash());
    assert_ne!(a.hash(), c.hash());
    assert_eq!(a.hash(), UnitHash::of_bytes(a.canonical().as_bytes()));
}

#[test]
fn refuses_bad_files_naming_the_line() {
    let long_value = format!("[S]\nA={}\n", "x".repeat(MAX_LINE_BYTES - 2));
    let long_comment = format!("[S]\nA=b\n#{}\n", "x".repeat(MAX_LINE_BYTES));
    let long_continuation = format!("[S]\nA=b\\\n{}\n", "x".repeat(MAX_LINE_BYTES));
    let table: &[(&[u8], ParseError, &str)] = &[
        (
            long_value.as_bytes(),
            ParseError::LineTooLong { line: 2 },
            "line 2 too long (max 2048 bytes)",
        ),
        (
            long_comment.as_bytes(),
            ParseError::LineTooLong { line: 3 },
            "line 3 too long (max 2048 bytes)",
        ),
        (
            long_continuation.as_bytes(),
            ParseError::LineTooLong { line: 3 },
            "line 3 too long (max 2048 bytes)",
        ),
        (
            b"[S]\nnot an assignment\n",
            ParseError::NotAnAssignment {
                line: 2,
                text: "not an assignment".into(),
            },
            "line 2: expected Name=Value, found \"not an assignment\"",
        ),
        (
            b"[S]\nA=b\nlast",
            ParseError::NotAnAssignment {
                line: 3,
                text: "last".into(),
            },
            "line 3: expected Name=Value, found \"last\"",
        ),
        (
            // A CRLF line ending in `\` continues nothing in fleet: the next line is an option.
            b"[S]\r\nA=x \\\r\n  y\r\n",
            ParseError::NotAnAssignment {
                line: 3,
                text: "y".into(),
            },
            "line 3: expected Name=Value, found \"y\"",
        ),
        (
            b"[S\nA=b\n",
            ParseError::UnterminatedSection { line: 1 },
            "line 1: unterminated section header",
        ),
        (
            b"\n[S] x\nA=b\n",
            ParseError::GarbageAfterSection {
                line: 2,
                section: "S".into(),
            },
            "line 2: found garbage after section name \"S\"",
        ),
        (
            b"[S]\rA=b\r",
            ParseError::GarbageAfterSection {
                line: 1,
                section: "S".into(),
            },
            "line 1: found garbage after section name \"S\"",
        ),
    ];
    for (bytes, want, message) in table {
        let got = UnitFile::parse(bytes).expect_err(&String::from_utf8_lossy(bytes));
        assert_eq!(&got, want, "{:?}", String::from_utf8_lossy(bytes));
        assert_eq!(got.to_string(), *message);
    }
}

/// A file and the `(section, name, value)` options it reads as.
type Reads<'a> = (&'a [u8], &'a [(&'a str, &'a str, &'a str)]);

#[test]
fn accepts_what_fleet_accepts_as_fleet_reads_it() {
    let table: &[Reads] = &[
        // Nothing at all, or only comments and headers: no options, as in fleet.
        (b"", &[]),
        (b"# only\n[Unit]\n\n", &[]),
        // Text before the first section is skipped, up to a `[` wherever it is.
        (b"# c\nA=b\n[S]\nC=d\n", &[("S", "C", "d")]),
        (b"junk [T]\nA=b\n", &[("T", "A", "b")]),
        (b"A=b ;[T]\n[S]\nC=d\n", &[("S", "C", "d")]),
        // An empty name, a name with a space, a section name across lines.
        (b"[S]\n=v\n", &[("S", "", "v")]),
        (b"[S]\nA B = v\n", &[("S", "A B", "v")]),
        (b"[S\nT]\nA=b\n", &[("S\nT", "A", "b")]),
        // Bytes fleet keeps: NUL as it is, invalid UTF-8 as U+FFFD (its JSON), a BOM skipped.
        (b"[S]\nA=a\0b\n", &[("S", "A", "a\0b")]),
        (b"[S]\nA=caf\xe9\n", &[("S", "A", "caf\u{fffd}")]),
        (b"\xef\xbb\xbf[S]\nA=b\n", &[("S", "A", "b")]),
        // A value that still ends in `\` is joined to the next line when fleet reads back
        // what it stored.
        (b"[S]\nA=x\\ \nB=y\n", &[("S", "A", "x\\\nB=y")]),
        // A lone `\r` is not a line end.
        (b"[S]\nA=a\rb\n", &[("S", "A", "a\rb")]),
    ];
    for (bytes, want) in table {
        let unit = UnitFile::parse(bytes).unwrap_or_else(|e| panic!("{bytes:?}: {e}"));
        assert_eq!(
            triples(&unit),
            *want,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn refuses_a_long_line_only_where_fleets_read_buffer_sees_it() {
    // fleet looks for a line end in the next 2048 bytes only with 2048 bytes buffered, from a
    // 4096-byte buffer: a long last line that starts late in the first buffer passes.
    let short = "Environment=K=vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\n".repeat(60);
    let long = format!("ExecStart=/bin/echo {}\n", "a".repeat(2500));
    let late = format!("[S]\n{short}{long}");
    let early = format!("[S]\n{long}{short}");
    assert!(UnitFile::parse(late.as_bytes()).is_ok());
    assert_eq!(
        UnitFile::parse(early.as_bytes()).unwrap_err(),
        ParseError::LineTooLong { line: 2 }
    );
    // A `\r` inside counts as a line end for that check.
    let with_cr = format!("[S]\nA={}\r{}\n", "a".repeat(1500), "b".repeat(1500));
    assert!(UnitFile::parse(with_cr.as_bytes()).is_ok());
}

#[test]
fn accepts_the_longest_line_that_fits() {
    let fits = format!("[S]\nA={}\r\n", "x".repeat(MAX_LINE_BYTES - 3));
    assert_eq!(parse(&fits).options()[0].value.len(), MAX_LINE_BYTES - 3);
}

#[test]
fn refuses_files_over_the_size_limit() {
    let mut big = b"[S]\n".to_vec();
    while big.len() <= MAX_UNIT_FILE_BYTES {
        big.extend_from_slice(b"A=0123456789012345678901234567890123456789\n");
    }
    assert_eq!(
        UnitFile::parse(&big),
        Err(ParseError::TooLarge { size: big.len() })
    );
}

#[test]
fn parses_hashes_only_as_40_lowercase_hex_digits() {
    let text = "3750b3e9f3962a56c7582929426e9abb012754cf";
    let hash: UnitHash = text.parse().unwrap();
    assert_eq!(hash.to_string(), text);
    assert_eq!(serde_json::to_string(&hash).unwrap(), format!("\"{text}\""));
    for bad in [
        "",
        "3750b3e",
        &text.to_uppercase(),
        &format!("{text}0"),
        &text.replace('f', "g"),
        "é750b3e9f3962a56c7582929426e9abb012754c",
    ] {
        assert!(bad.parse::<UnitHash>().is_err(), "{bad:?}");
    }
    // Every digit in every place: SHA-1s of many inputs, against the long way of spelling
    // them.
    for i in 0..256 {
        let hash = UnitHash::of_bytes(format!("{i}").as_bytes());
        let long: String = hash.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hash.to_string(), long);
        assert_eq!(long.parse::<UnitHash>(), Ok(hash));
    }
}

/// Unit file text with the awkward parts: comments, continuations, blank and space-only
/// lines, CRLF, repeated keys and sections, empty values.
fn unit_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        8 => "[ -~]{0,30}",
        3 => "[ -~]{0,10}\\\\",
        1 => "[a-z]{1,5}\\\\ ",
    ];
    let line = prop_oneof![
        3 => ("[A-Z][A-Za-z]{0,6}", "[ \t]{0,2}", value).prop_map(|(n, s, v)| format!("{s}{n}{s}={v}")),
        1 => "[#;][ -~]{0,20}",
        1 => "[ \t]{0,3}",
        1 => "\\[(Unit|Service|X-Fleet|Install)\\]",
    ];
    (
        "\\[(Unit|Service|X-Fleet)\\]",
        prop::collection::vec(line, 0..16),
        prop::bool::ANY,
        prop::bool::ANY,
    )
        .prop_map(|(first, lines, crlf, final_newline)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut text = std::iter::once(first)
                .chain(lines)
                .collect::<Vec<_>>()
                .join(eol);
            if final_newline {
                text.push_str(eol);
            }
            text
        })
}

proptest! {
    // About half the generated texts parse; the rest exercise the error paths.
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn canonical_text_is_a_fixed_point(text in unit_text()) {
        if let Ok(unit) = UnitFile::parse(text.as_bytes()) {
            let canonical = unit.canonical();
            let again = UnitFile::parse(canonical.as_bytes()).unwrap();
            prop_assert_eq!(again.canonical(), canonical);
            prop_assert_eq!(again.hash(), unit.hash());
            prop_assert_eq!(again, unit);
        }
    }

    #[test]
    fn parsing_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = UnitFile::parse(&bytes);
    }
}

#[test]
fn a_final_continuation_hashes_the_same_with_or_without_the_final_newline() {
    let with = parse("[Service]\nExecStart=/bin/true \\\n");
    let without = parse("[Service]\nExecStart=/bin/true \\");
    assert_eq!(with.hash(), without.hash());
    assert_eq!(parse(&with.canonical()).hash(), with.hash());
}

#[test]
fn skips_a_byte_order_mark_without_changing_the_hash() {
    let plain = parse("[Service]\nExecStart=/bin/true\n");
    let marked = UnitFile::parse(b"\xEF\xBB\xBF[Service]\nExecStart=/bin/true\n").unwrap();
    assert_eq!(marked.canonical(), plain.canonical());
    assert_eq!(marked.hash(), plain.hash());
    // fleet skips whatever comes before the first `[`, so two marks are skipped too.
    let twice = UnitFile::parse(b"\xEF\xBB\xBF\xEF\xBB\xBF[Service]\nExecStart=/bin/true\n");
    assert_eq!(twice.unwrap().hash(), plain.hash());
}

#[test]
fn keeps_a_nul_byte_as_fleet_does() {
    let unit = UnitFile::parse(b"[Service]\nExecStart=/bin/true\0\n").unwrap();
    assert_eq!(unit.options()[0].value, "/bin/true\0");
}

#[test]
fn the_api_form_length_is_what_serde_json_writes() {
    let unit = UnitFile::parse(
        "[Service]\nExecStart=/bin/sh -c \"echo \\\\ \t \x01 é\"\nEnvironment=A=1\n[X-Fleet]\nMachineOf=a\n"
            .as_bytes(),
    )
    .unwrap();
    let json = serde_json::to_string(unit.options()).unwrap();
    assert_eq!(unit.api_form_len(), json.len(), "{json}");
}

/// A file within the size limit whose API form (the section repeated on every option) would
/// not fit the API's request body is refused by both drivers alike.
#[test]
fn a_file_of_many_short_options_too_large_for_the_api_is_refused() {
    let mut many = String::from("[Service]\n");
    while many.len() < 900 * 1024 {
        many.push_str("A=\n");
    }
    let Err(err) = UnitFile::parse(many.as_bytes()) else {
        panic!("a file of 300,000 options was accepted");
    };
    assert!(matches!(err, ParseError::ApiFormTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("API form"), "{err}");
    // A file of the largest size in long options fits.
    let mut long = String::from("[Service]\n");
    let line = format!("Environment={}\n", "x".repeat(1000));
    while long.len() + line.len() < MAX_UNIT_FILE_BYTES - 64 {
        long.push_str(&line);
    }
    let unit = UnitFile::parse(long.as_bytes()).unwrap();
    assert!(unit.api_form_len() < MAX_API_FORM_BYTES);
}
