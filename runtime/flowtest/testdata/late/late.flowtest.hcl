run "a late order, sent twice, is counted late, a duplicate and dropped where it is dropped" {
  send {
    topic = topic.orders
    messages = [
      { customer = "a", id = "o1", at = "2026-01-01T00:00:10Z" },
      { customer = "a", id = "o2", at = "2026-01-01T00:02:00Z" }, # the watermark passes the first minute
      { customer = "a", id = "o1", at = "2026-01-01T00:00:20Z" }, # late for both, and a duplicate
    ]
  }
  expect {
    sink     = sink.per_minute
    messages = [{ key = "a", orders = 1, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } }]
  }
  expect {
    sink     = sink.per_minute_too
    messages = [{ key = "a", orders = 1, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } }]
  }
  expect {
    sink  = sink.orders
    count = 2
  }
  expect_dead_letters {
    stage    = stage.dead_lettering
    messages = [{ payload = { customer = "a", id = "o1", at = "2026-01-01T00:00:20Z" }, reason = "late" }]
  }
  assert {
    condition     = metrics.dropping.late == 1 && metrics.dropping.dropped == 1 && metrics.dropping.filtered == 0
    error_message = "the aggregate that drops late orders counts the late order as late and dropped, not filtered"
  }
  assert {
    condition     = metrics.dead_lettering.late == 1 && metrics.dead_lettering.dead_lettered == 1 && metrics.dead_lettering.dropped == 0 && metrics.dead_lettering.filtered == 0
    error_message = "the aggregate that dead-letters late orders counts the late order as late and dead-lettered, not dropped"
  }
  assert {
    condition     = metrics.once.duplicates == 1 && metrics.once.dropped == 1 && metrics.once.filtered == 0 && metrics.once.late == 0
    error_message = "the dedupe counts the copy as a duplicate and dropped, not filtered"
  }
}
