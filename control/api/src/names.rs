//! Ops and data types as their names in JSON and TOML (`"sum"`, `"i32"`): typed enums on
//! the wire format's side, names here. An unknown name is refused with the valid ones.

use std::{fmt::Display, str::FromStr};

use serde::{de::Error, Deserialize, Deserializer, Serializer};

/// `#[serde(with = "names")]` for a field of type `Op` or `DType`.
pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
where
    T: FromStr,
    T::Err: Display,
    D: Deserializer<'de>,
{
    let s = String::deserialize(d)?;
    s.parse()
        .map_err(|e| D::Error::custom(format!("`{s}`: {e}")))
}
