//! Table output byte-for-byte like fleet's: Go's `text/tabwriter` with minwidth 0, tabwidth 8,
//! padding 1 and TAB as the pad character. A column is as wide as its widest cell plus one,
//! rounded up to a multiple of 8, and cells are padded with TABs; the last column is unpadded.

const TAB_WIDTH: usize = 8;

/// Renders `rows` (each a list of cells) as fleet renders them; every row ends in `\n`.
pub fn render(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; columns.saturating_sub(1)];
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(widths.len()) {
            if i + 1 < row.len() {
                widths[i] = widths[i].max(cell.chars().count() + 1);
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < row.len() {
                let cell_width = widths[i].div_ceil(TAB_WIDTH) * TAB_WIDTH;
                let gap = cell_width - cell.chars().count();
                for _ in 0..gap.div_ceil(TAB_WIDTH) {
                    out.push('\t');
                }
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    fn rows(r: &[&[&str]]) -> Vec<Vec<String>> {
        r.iter()
            .map(|row| row.iter().map(|c| c.to_string()).collect())
            .collect()
    }

    #[test]
    fn matches_fleets_list_units_bytes() {
        let out = render(&rows(&[
            &["UNIT", "MACHINE", "ACTIVE", "SUB"],
            &[
                "hello.service",
                "69aee328.../10.0.2.15",
                "active",
                "running",
            ],
        ]));
        assert_eq!(
            out,
            "UNIT\t\tMACHINE\t\t\tACTIVE\tSUB\nhello.service\t69aee328.../10.0.2.15\tactive\trunning\n"
        );
    }

    #[test]
    fn matches_fleets_list_unit_files_bytes() {
        let out = render(&rows(&[
            &["UNIT", "HASH", "DSTATE", "STATE", "TARGET"],
            &[
                "hello.service",
                "3750b3e",
                "launched",
                "launched",
                "69aee328.../10.0.2.15",
            ],
        ]));
        assert_eq!(
            out,
            "UNIT\t\tHASH\tDSTATE\t\tSTATE\t\tTARGET\nhello.service\t3750b3e\tlaunched\tlaunched\t69aee328.../10.0.2.15\n"
        );
    }

    #[test]
    fn matches_fleets_list_machines_bytes() {
        let out = render(&rows(&[
            &["MACHINE", "IP", "METADATA"],
            &["69aee328...", "10.0.2.15", "az=a,region=us"],
            &["113f16a7...", "-", "-"],
        ]));
        assert_eq!(
            out,
            "MACHINE\t\tIP\t\tMETADATA\n69aee328...\t10.0.2.15\taz=a,region=us\n113f16a7...\t-\t\t-\n"
        );
    }

    #[test]
    fn renders_nothing_for_no_rows() {
        assert_eq!(render(&[]), "");
    }
}
