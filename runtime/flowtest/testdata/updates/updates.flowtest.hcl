run "every update arrives, though two batches end at the same event time" {
  step {
    send {
      topic    = topic.views
      messages = [{ user = "a", at = "2026-01-01T00:00:10Z" }]
    }
  }
  step {
    send {
      topic    = topic.views
      messages = [{ user = "a", at = "2026-01-01T00:00:10Z" }]
    }
  }
  expect {
    sink = sink.out
    messages = [
      { key = "a", views = 1, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } },
      { key = "a", views = 2, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } },
    ]
  }
}
