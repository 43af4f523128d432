//! Statements written as the other backends write them, with numbered
//! parameters (`$1`, `$2`, ... each as often as needed), run on MariaDB,
//! whose protocol knows only `?`, each bound once, in order. [`query`] and
//! [`query_as`] turn the text once per statement (kept for the life of the
//! process: the statements are constants, so the set is small and fixed) and
//! bind the values in the order its `?`s stand.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use sqlx::mysql::{MySql, MySqlArguments};
use sqlx::query::{Query, QueryAs};
use sqlx::Arguments;

use crate::store::error::StoreError;
use crate::store::params::Param;

/// A statement's text with `?` for each `$N`, and which value each `?` takes
/// (0-based).
struct Positional {
    sql: &'static str,
    order: Vec<usize>,
}

/// Each numbered statement's positional form, by the address of its text.
static TURNED: LazyLock<Mutex<HashMap<(usize, usize), &'static Positional>>> =
    LazyLock::new(Mutex::default);

/// The positional form of `numbered`, turned on its first use.
fn positional(numbered: &'static str) -> &'static Positional {
    let id = (numbered.as_ptr() as usize, numbered.len());
    let mut turned = TURNED.lock().unwrap_or_else(|e| e.into_inner());
    turned.entry(id).or_insert_with(|| {
        // Leaked once per statement: they live as long as the process does.
        Box::leak(Box::new(turn(numbered)))
    })
}

/// `$N` → `?`, outside quoted text.
fn turn(numbered: &str) -> Positional {
    let mut sql = String::with_capacity(numbered.len());
    let mut order = Vec::new();
    let mut chars = numbered.char_indices().peekable();
    let mut quoted = false;
    while let Some((_, c)) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '$' && !quoted {
            let mut n = 0usize;
            let mut digits = 0;
            while let Some(&(_, d)) = chars.peek() {
                let Some(v) = d.to_digit(10) else { break };
                n = n * 10 + v as usize;
                digits += 1;
                chars.next();
            }
            if digits > 0 && n > 0 {
                sql.push('?');
                order.push(n - 1);
                continue;
            }
        }
        sql.push(c);
    }
    Positional {
        sql: Box::leak(sql.into_boxed_str()),
        order,
    }
}

/// The arguments of `positional`, from `params` in `$N` order.
fn arguments<'q>(
    positional: &Positional,
    params: &[Param<'q>],
) -> Result<MySqlArguments, StoreError> {
    let mut args = MySqlArguments::default();
    for &i in &positional.order {
        let param = params.get(i).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "statement wants ${} of {} values: {}",
                i + 1,
                params.len(),
                positional.sql
            ))
        })?;
        match *param {
            Param::Int(v) => args.add(v),
            Param::OptInt(v) => args.add(v),
            Param::SmallInt(v) => args.add(v),
            Param::Text(v) => args.add(v.to_owned()),
            Param::OptText(v) => args.add(v.map(str::to_owned)),
            Param::Bytes(v) => args.add(v.to_vec()),
            Param::OptBytes(v) => args.add(v.map(<[u8]>::to_vec)),
        }
        .map_err(|e| StoreError::Database(sqlx::Error::Encode(e)))?;
    }
    Ok(args)
}

/// `numbered` with `params` bound, to execute.
pub(super) fn query(
    numbered: &'static str,
    params: &[Param<'_>],
) -> Result<Query<'static, MySql, MySqlArguments>, StoreError> {
    let positional = positional(numbered);
    Ok(sqlx::query_with(
        positional.sql,
        arguments(positional, params)?,
    ))
}

/// `numbered` with `params` bound, its rows read as `T`.
pub(super) fn query_as<T>(
    numbered: &'static str,
    params: &[Param<'_>],
) -> Result<QueryAs<'static, MySql, T, MySqlArguments>, StoreError>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow>,
{
    let positional = positional(numbered);
    Ok(sqlx::query_as_with(
        positional.sql,
        arguments(positional, params)?,
    ))
}

/// The parameters of a statement, each turned into a [`Param`].
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        &[$(crate::store::params::Param::from($value)),*]
    };
}
pub(super) use params;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_become_question_marks_in_the_order_they_stand() {
        let p = turn("select $2, $1 from t where a = $2 and b = '$1' and c = $10");
        assert_eq!(
            p.sql,
            "select ?, ? from t where a = ? and b = '$1' and c = ?"
        );
        assert_eq!(p.order, vec![1, 0, 1, 9]);
    }
}
