run "views a few minutes apart are one session, which the next view 16 minutes later closes" {
  send {
    topic = topic.views
    messages = [
      { user = "u1", page = "home", at = "2026-01-01T00:00:00Z" },
      { user = "u1", page = "cart", at = "2026-01-01T00:02:00Z" },
      { user = "u1", page = "cart", at = "2026-01-01T00:04:00Z" },
      { user = "u1", page = "home", at = "2026-01-01T00:20:00Z" },
    ]
  }
  expect {
    sink = sink.out
    messages = [
      { key = "u1", views = 3, pages = 2, first = "home", last = "cart", window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:09:00Z" } },
    ]
  }
}

# A step's expectations are about the run so far: each lists what arrived since the run began.
run "a view that bridges two sessions merges them" {
  step {
    # 00:35 is 5 minutes after 00:30, not less: a session of its own. The watermark at 00:35
    # closes u1's session of 00:20.
    send {
      topic = topic.views
      messages = [
        { user = "u2", page = "home", at = "2026-01-01T00:30:00Z" },
        { user = "u2", page = "faq", at = "2026-01-01T00:35:00Z" },
      ]
    }
    expect {
      sink = sink.out
      messages = [
        { key = "u1", views = 1, pages = 1, first = "home", last = "home", window = { start = "2026-01-01T00:20:00Z", end = "2026-01-01T00:25:00Z" } },
      ]
    }
    expect {
      sink  = sink.changelog
      match = "unordered"
      messages = [
        { key = "u1", views = 1, window = { start = "2026-01-01T00:20:00Z", end = "2026-01-01T00:25:00Z" } },
        { key = "u2", views = 1, window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:35:00Z" } },
        { key = "u2", views = 1, window = { start = "2026-01-01T00:35:00Z", end = "2026-01-01T00:40:00Z" } },
      ]
    }
  }
  step {
    # 00:34 is less than 5 minutes from both: one session from 00:30 to 00:40.
    send {
      topic    = topic.views
      messages = [{ user = "u2", page = "cart", at = "2026-01-01T00:34:00Z" }]
    }
    expect {
      sink  = sink.out
      count = 1 # nothing closed
    }
    expect {
      sink  = sink.changelog
      match = "unordered"
      messages = [
        { key = "u1", views = 1, window = { start = "2026-01-01T00:20:00Z", end = "2026-01-01T00:25:00Z" } },
        { key = "u2", views = 1, window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:35:00Z" } },
        { key = "u2", views = 1, window = { start = "2026-01-01T00:35:00Z", end = "2026-01-01T00:40:00Z" } },
        { key = "u2", views = 3, window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:40:00Z" } },
      ]
    }
  }
  step {
    # The merged session closes once; the session merged into it never does.
    send {
      topic    = topic.views
      messages = [{ user = "u3", page = "home", at = "2026-01-01T01:00:00Z" }]
    }
  }
  expect {
    sink  = sink.out
    match = "unordered"
    messages = [
      { key = "u1", views = 1, pages = 1, first = "home", last = "home", window = { start = "2026-01-01T00:20:00Z", end = "2026-01-01T00:25:00Z" } },
      { key = "u2", views = 3, pages = 3, first = "home", last = "faq", window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:40:00Z" } },
    ]
  }
  expect {
    sink  = sink.changelog
    match = "unordered"
    messages = [
      { key = "u1", views = 1, window = { start = "2026-01-01T00:20:00Z", end = "2026-01-01T00:25:00Z" } },
      { key = "u2", views = 1, window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:35:00Z" } },
      { key = "u2", views = 1, window = { start = "2026-01-01T00:35:00Z", end = "2026-01-01T00:40:00Z" } },
      { key = "u2", views = 3, window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:40:00Z" } }, # after the batch that merged them
      { key = "u2", views = 3, window = { start = "2026-01-01T00:30:00Z", end = "2026-01-01T00:40:00Z" } }, # as it closes
      { key = "u3", views = 1, window = { start = "2026-01-01T01:00:00Z", end = "2026-01-01T01:05:00Z" } },
    ]
  }
}

run "a view whose session could only be one that has closed is late" {
  step {
    send {
      topic = topic.views
      messages = [
        { user = "u1", page = "late", at = "2026-01-01T00:50:00Z" }, # 00:50 + 5m gap + 1m grace is before the watermark, 01:00, and u1 has no open session
        { user = "u3", page = "cart", at = "2026-01-01T00:56:00Z" }, # joins u3's open session of 01:00
        { user = "u4", page = "home", at = "2026-01-01T00:55:00Z" }, # a session of its own, to 01:00, closing at 01:01
      ]
    }
    expect {
      sink     = sink.late
      messages = [{ user = "u1", page = "late", at = "2026-01-01T00:50:00Z" }]
    }
    assert {
      condition     = metrics.sessions.late == 1 && metrics.updates.late == 1
      error_message = "one view is late, in both stages"
    }
  }
  step {
    send {
      topic    = topic.views
      messages = [{ user = "u5", page = "home", at = "2026-01-01T02:00:00Z" }]
    }
    expect {
      sink  = sink.out
      match = "unordered"
      messages = [
        { key = "u4", views = 1, pages = 1, first = "home", last = "home", window = { start = "2026-01-01T00:55:00Z", end = "2026-01-01T01:00:00Z" } },
        { key = "u3", views = 2, pages = 2, first = "cart", last = "home", window = { start = "2026-01-01T00:56:00Z", end = "2026-01-01T01:05:00Z" } },
      ]
    }
  }
}

run "an open session lives through a crash" {
  send {
    topic = topic.views
    messages = [
      { user = "u6", page = "home", at = "2026-01-01T03:00:00Z" },
      { user = "u6", page = "cart", at = "2026-01-01T03:03:00Z" },
    ]
  }
  step {
    crash = true
  }
  step {
    send {
      topic = topic.views
      messages = [
        { user = "u6", page = "pay", at = "2026-01-01T03:06:00Z" },
        { user = "u7", page = "home", at = "2026-01-01T03:30:00Z" },
      ]
    }
  }
  expect {
    sink  = sink.out
    match = "unordered"
    messages = [
      { key = "u5", views = 1, pages = 1, first = "home", last = "home", window = { start = "2026-01-01T02:00:00Z", end = "2026-01-01T02:05:00Z" } },
      { key = "u6", views = 3, pages = 3, first = "home", last = "pay", window = { start = "2026-01-01T03:00:00Z", end = "2026-01-01T03:11:00Z" } },
    ]
  }
}
