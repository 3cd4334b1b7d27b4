-- Fraud alerts in SQL: 3 or more transactions of a card in one minute of event time.
--
-- The rule of jobs/fraud_alerts.py, with its alert table, on the generator's card
-- transactions (the same rows as fraud_alerts.generated_transactions: 50 events
-- per second of event time from 2026-01-01, up to 5 s of disorder, a
-- late_fraction of them 1 min to 1 h late). jobs/fraud_alerts_files.sql is the
-- same INSERT over replayed Parquet files.
-- - EMIT ON UPDATE with HAVING fires the rule early, once per window: in the
--   batch where the third transaction arrives (revision 0), then each later
--   change of that window as a correction (revision 1, 2...), MERGEd into the
--   Delta table by alert_id: the table ends with the window's final count;
-- - the watermark trails the newest event time by 10 s, and a transaction up to
--   1 h late still counts (SET 'table.exec.emit.allow-lateness'); later ones
--   are dropped and counted (the Python job also writes them to a late table);
-- - one Delta table is the output (no webhook, alerts topic or late table).
--
--   microbatch sql jobs/fraud_alerts.sql --checkpoint chk/fraud-sql \
--       --trigger available-now --param rows=100000 --param cards=2000 \
--       --param seed=0 --param late_fraction=0.01 --param output=lake/fraud_alerts_sql

SET 'table.exec.emit.allow-lateness' = '1 h';

CREATE TABLE tx (
  event_id BIGINT, card_id BIGINT, merchant STRING, amount DECIMAL(18, 2),
  event_time TIMESTAMP(3),
  WATERMARK FOR event_time AS event_time - INTERVAL '10' SECOND
) WITH (
  'connector' = 'generator', 'rows_per_second' = 'none', 'event_rate' = '50',
  'start' = '2026-01-01T00:00:00+00:00', 'total_rows' = '${rows}', 'cards' = '${cards}',
  'seed' = '${seed}', 'late_fraction' = '${late_fraction}', 'max_records_per_batch' = '5000'
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
