//! The rate-limit headers read back with a real RFC 9651 parser (`sfv`):
//! members and parameters compared by value, never as strings.
#![allow(dead_code)]

use std::collections::HashMap;

use sfv::{BareItem, ListEntry, Parser};

/// One list member: its name (an sf-string) and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub name: String,
    pub params: HashMap<String, BareItem>,
}

impl Member {
    pub fn int(&self, key: &str) -> Option<i64> {
        self.params.get(key)?.as_integer().map(i64::from)
    }

    pub fn string(&self, key: &str) -> Option<String> {
        self.params
            .get(key)?
            .as_string()
            .map(|s| s.as_str().to_owned())
    }

    pub fn bytes(&self, key: &str) -> Option<Vec<u8>> {
        self.params.get(key)?.as_byte_sequence().map(<[u8]>::to_vec)
    }
}

/// Parses a `RateLimit` or `RateLimit-Policy` value; panics when it is not
/// a list of string items, as the draft requires.
pub fn members(value: &str) -> Vec<Member> {
    let list: sfv::List = Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => Member {
                name: item
                    .bare_item
                    .as_string()
                    .unwrap_or_else(|| panic!("{value:?}: member names are sf-strings"))
                    .as_str()
                    .to_owned(),
                params: item
                    .params
                    .into_iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v))
                    .collect(),
            },
            ListEntry::InnerList(_) => panic!("{value:?}: no inner lists"),
        })
        .collect()
}

/// The member named `name` of the header `header` in `res`.
pub fn member(res: &reqwest::Response, header: &str, name: &str) -> Member {
    let value = res
        .headers()
        .get_all(header)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join(", ");
    members(&value)
        .into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name:?} in {header}: {value:?}"))
}
