run "the first of each order passes, the others go to dupes" {
  send {
    topic = topic.orders
    messages = [
      { order_id = "o1", at = "2026-01-01T00:00:00Z" },
      { order_id = "o1", at = "2026-01-01T00:10:00Z" },
      { order_id = "o2", at = "2026-01-01T00:20:00Z" },
      { order_id = "o1", at = "2026-01-01T01:30:00Z" },
    ]
  }
  expect {
    sink = sink.out
    messages = [
      { order_id = "o1", at = "2026-01-01T00:00:00Z" },
      { order_id = "o2", at = "2026-01-01T00:20:00Z" },
      { order_id = "o1", at = "2026-01-01T01:30:00Z" },
    ]
  }
  expect {
    sink     = sink.dupes
    messages = [{ order_id = "o1", at = "2026-01-01T00:10:00Z" }]
  }
}

run "a key is forgotten once the watermark is an hour past it" {
  send {
    topic = topic.orders
    messages = [
      { order_id = "o3", at = "2026-01-01T02:00:00Z" },
      { order_id = "o4", at = "2026-01-01T03:30:00Z" }, # the watermark passes o3's hour
      { order_id = "o3", at = "2026-01-01T02:30:00Z" }, # within the hour, but o3 is forgotten
    ]
  }
  expect {
    sink  = sink.out
    count = 3
  }
  expect {
    sink  = sink.dupes
    count = 0
  }
}

run "the memory of a key survives a crash" {
  send {
    topic    = topic.orders
    messages = [{ order_id = "o5", at = "2026-01-01T04:00:00Z" }]
  }
  step {
    crash = true
  }
  step {
    send {
      topic    = topic.orders
      messages = [{ order_id = "o5", at = "2026-01-01T04:05:00Z" }]
    }
  }
  expect {
    sink  = sink.out
    count = 1
  }
  expect {
    sink  = sink.dupes
    count = 1
  }
}
