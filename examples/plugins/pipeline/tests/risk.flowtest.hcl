# The sample orders through the real acme.score (run with flowrun-acme, which has it): risk is
# amount/20, plus 50 in the risky countries XX and ZZ, at most 100, rounded; 50 and up is risky.

run "the risky sample orders go to review" {
  send {
    source = source.orders
    file   = "../orders.jsonl"
  }
  # Order 4 scores 49.5, which rounds to 50: risky. Orders 1 (6) and 7 (1) are not.
  expect {
    sink = sink.review
    messages = [
      { key = "bob", payload = { id = 2, customer = "bob", amount = 2400, country = "FR", risk = 100 } },
      { key = "carol", payload = { id = 3, customer = "carol", amount = 40, country = "XX", risk = 52 } },
      { key = "alice", payload = { id = 4, customer = "alice", amount = 990, country = "DE", risk = 50 } },
      { key = "erin", payload = { id = 6, customer = "erin", amount = 1500, country = "ZZ", risk = 100 } },
    ]
  }
  # The review sheet gets the same orders (in a test it captures them instead of writing the CSV).
  expect {
    sink  = sink.review_sheet
    match = "unordered"
    messages = [
      { id = 2, customer = "bob", amount = 2400, country = "FR", risk = 100 },
      { id = 3, customer = "carol", amount = 40, country = "XX", risk = 52 },
      { id = 4, customer = "alice", amount = 990, country = "DE", risk = 50 },
      { id = 6, customer = "erin", amount = 1500, country = "ZZ", risk = 100 },
    ]
  }
  # acme.score fails order 5 for good: its amount is not a number.
  expect_dead_letters {
    stage    = stage.score
    count    = 1
    messages = [{ payload = { id = 5, customer = "dave", amount = "unknown", country = "NL" }, reason = "order 5: amount: unknown is not a number", attempts = 1 }]
  }
  assert {
    condition     = metrics.risky.filtered == 2 && metrics.score.retries == 0
    error_message = "orders 1 and 7 are not risky, and the permanent failure is not retried"
  }
}

run "an order without an amount is dead-lettered too" {
  send {
    source   = source.orders
    messages = [{ id = 8, customer = "frank", country = "XX" }]
  }
  expect_dead_letters {
    stage    = stage.score
    messages = [{ reason = "order 8: amount: missing", attempts = 1 }]
  }
  expect {
    sink  = sink.review
    count = 0
  }
}
