//! Days since the Unix epoch as a calendar date, for times written in UTC (the CLI's
//! leader stamps, the S3 adapter's request dates) without a date library.

/// The proleptic Gregorian `(year, month, day)` of the day `days` after 1970-01-01.
pub fn date_of_unix_day(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::date_of_unix_day;

    #[test]
    fn dates_across_leap_days_centuries_and_the_epoch() {
        assert_eq!(date_of_unix_day(0), (1970, 1, 1));
        assert_eq!(date_of_unix_day(-1), (1969, 12, 31));
        assert_eq!(date_of_unix_day(11_016), (2000, 2, 29));
        assert_eq!(date_of_unix_day(47_540), (2100, 2, 28));
        assert_eq!(date_of_unix_day(47_541), (2100, 3, 1), "2100 is not a leap year");
        assert_eq!(date_of_unix_day(20_792), (2026, 12, 5));
    }
}
