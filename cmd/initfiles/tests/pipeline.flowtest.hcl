# Tests of the starter pipeline: flowrun test runs them on an embedded Redis and a virtual clock.
# A minute is reported once a later order of its partition has moved the orders' time past its end.

run "paid orders are summed per customer and minute" {
  send {
    source = source.orders
    messages = [
      { order = "o-1", customer = "alice", status = "paid", amount = 12.5, at = "2026-03-01T09:00:05Z" },
      { order = "o-2", customer = "alice", status = "cancelled", amount = 99, at = "2026-03-01T09:00:30Z" },
      { order = "o-3", customer = "alice", status = "paid", amount = 7.5, at = "2026-03-01T09:00:40Z" },
      { order = "o-4", customer = "alice", status = "paid", amount = 20, at = "2026-03-01T09:01:30Z" },
    ]
  }
  expect {
    sink = sink.totals
    messages = [
      { key = "alice", orders = 2, revenue = 20, window = { start = "2026-03-01T09:00:00Z", end = "2026-03-01T09:01:00Z" } },
    ]
  }
}
