//! The shape of a request's JSON before it is decoded (issue 38, item 9). serde's derived
//! structs also take a JSON array of their fields in order, so `["x",[…],"launched"]` was a
//! unit and `[["Service","ExecStart","/bin/true"]]` its options; fleet answered 400 to both.
//! Every entity fleet's API takes is an object (`PATCH /machines`: an array of objects), and
//! none holds an array of arrays, so a body is refused when its top level is not what the
//! route takes or when an array holds an array. One pass over the bytes, no allocation.

/// What a route's body must be at its top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Top {
    Object,
    Array,
}

/// Why `body` has not the shape of an entity, if it has not. Malformed JSON is left to the
/// decoder, which says where.
pub fn refusal(body: &[u8], top: Top) -> Option<&'static str> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    match (top, first) {
        (Top::Object, b'{') | (Top::Array, b'[') => {}
        (Top::Object, _) => return Some("the body must be a JSON object"),
        (Top::Array, _) => return Some("the body must be a JSON array of objects"),
    }
    let mut stack: Vec<u8> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' => {
                if stack.last() == Some(&b'[') {
                    return Some("an array in the body holds an array where an object belongs");
                }
                stack.push(b);
            }
            b'{' => stack.push(b),
            b']' | b'}' => {
                stack.pop();
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_for_objects_are_refused_and_entities_pass() {
        let unit = br#"{"desiredState":"launched","options":[{"section":"Service","name":"ExecStart","value":"/bin/[x]"}]}"#;
        assert_eq!(refusal(unit, Top::Object), None);
        assert_eq!(refusal(br#"{"name":"a \"[[\" b"}"#, Top::Object), None);
        assert!(refusal(br#"["x",[{"section":"S"}],"launched"]"#, Top::Object).is_some());
        assert!(
            refusal(
                br#"{"options":[["Service","ExecStart","/bin/true"]]}"#,
                Top::Object
            )
            .is_some()
        );
        assert!(refusal(b"[]", Top::Object).is_some());
        assert_eq!(
            refusal(
                br#"[{"op":"add","path":"/m/metadata/a","value":"b"}]"#,
                Top::Array
            ),
            None
        );
        assert!(refusal(br#"[["add","/m/metadata/a","b"]]"#, Top::Array).is_some());
        assert!(refusal(br#"{"op":"add"}"#, Top::Array).is_some());
        assert_eq!(refusal(b"  ", Top::Object), None, "left to the decoder");
    }
}
