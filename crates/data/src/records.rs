//! The records of a text shard as one format reads them ([`Records`]): the interface the
//! shard reader ([`crate::reader::ShardReader`]) takes the JSON-lines reader and the parquet
//! reader ([`crate::parquet_shard::ParquetRows`]) through.

/// One record of a text shard, as its format reads it.
pub(crate) enum Record {
    /// A document's text (empty or only whitespace: no document, passed over).
    Text(String),
    /// A record that holds nothing and is no error (a blank JSON line).
    Blank,
    /// A record without a usable text: why.
    Bad(String),
}

/// The records of one format of text shard, in file order.
pub(crate) trait Records: Send {
    /// The next record, `None` at the end of the shard.
    ///
    /// # Errors
    /// The shard's bytes are corrupt or truncated after the records read so far.
    fn next_record(&mut self) -> std::io::Result<Option<Record>>;

    /// Passes over up to `n` records without decoding their text (a resume); returns how many
    /// there were (fewer when the shard ends first).
    ///
    /// # Errors
    /// As [`Records::next_record`].
    fn skip_records(&mut self, n: u64) -> std::io::Result<u64>;

    /// Records read or passed over so far.
    fn consumed(&self) -> u64;
}
