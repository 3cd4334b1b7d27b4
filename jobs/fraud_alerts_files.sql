-- Fraud alerts in SQL over replayed Parquet files: jobs/fraud_alerts.sql's rule
-- (the same INSERT, kept identical by tests/jobs/test_fraud_alerts_sql.py) on a
-- directory of transaction files, as `microbatch run jobs/fraud_alerts.py
-- --param input=DIR` reads them (arrival order = file mtime; `python
-- jobs/fraud_alerts.py files --dir DIR` lands them). With the same
-- max_files_per_batch both jobs run the same batches, so their alert tables are
-- equal row for row, revisions included.
--
--   microbatch sql jobs/fraud_alerts_files.sql --checkpoint chk/fraud-sql-files \
--       --trigger available-now --param input=landing/tx --param max_files_per_batch=2 \
--       --param output=lake/fraud_alerts_sql

SET 'table.exec.emit.allow-lateness' = '1 h';

CREATE TABLE tx (
  event_id BIGINT, card_id BIGINT, merchant STRING, amount DECIMAL(18, 2),
  event_time TIMESTAMP(3),
  WATERMARK FOR event_time AS event_time - INTERVAL '10' SECOND
) WITH (
  'connector' = 'files', 'path' = '${input}', 'format' = 'parquet',
  'max_files_per_batch' = '${max_files_per_batch}'
);

CREATE TABLE fraud_alerts WITH (
  'connector' = 'delta', 'path' = '${output}', 'merge_keys' = 'alert_id'
);

INSERT INTO fraud_alerts
SELECT
  CAST(card_id AS VARCHAR) || '-' || CAST(EXTRACT(EPOCH FROM window_start) * 1000 AS BIGINT)
    AS alert_id,
  window_start, window_end, card_id,
  COUNT(*) AS transactions, SUM(amount) AS total_amount, MAX(amount) AS max_amount,
  MIN(event_time) AS first_event_time, MAX(event_time) AS last_event_time
FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, card_id
HAVING COUNT(*) >= 3
EMIT ON UPDATE;
