# The join under test, on the virtual clock. A test runs the pipeline as a service: a match comes
# out as soon as its click arrives; a view that no click matched comes out alone once the watermark
# is past its 10 minutes plus grace (30s), and, once the events stop, once the sides have been idle
# for the join's idle_timeout (a minute) and the watermark moves on with the clock. Each run sends
# the campaigns first, and the views in a step after: a view looks its campaign up in the table as
# the table holds it then.

run "the sample's views, with their clicks and campaigns" {
  send {
    source = source.campaigns
    file   = "../data/campaigns.jsonl"
  }
  step {
    send {
      source = source.views
      file   = "../data/views.jsonl"
    }
    send {
      source = source.clicks
      file   = "../data/clicks.jsonl"
    }
    advance = "15m"
  }
  expect {
    sink  = sink.clicked
    match = "unordered"
    messages = [
      { view_id = "v1", ad_id = "ad1", campaign = "spring sale", viewed = "2026-04-01T09:00:00Z", click_id = "k1", clicked = "2026-04-01T09:03:00Z" },
      { view_id = "v1", ad_id = "ad1", campaign = "spring sale", viewed = "2026-04-01T09:00:00Z", click_id = "k3", clicked = "2026-04-01T09:09:00Z" },
      { view_id = "v4", ad_id = "ad1", campaign = "spring sale", viewed = "2026-04-01T09:05:00Z", click_id = "k3", clicked = "2026-04-01T09:09:00Z" },
      { view_id = "v2", ad_id = "ad2", campaign = "spring sale", viewed = "2026-04-01T09:01:00Z", click_id = "k2", clicked = "2026-04-01T09:04:30Z" },
      { view_id = "v6", ad_id = "ad2", campaign = "spring sale", viewed = "2026-04-01T09:20:00Z", click_id = "k5", clicked = "2026-04-01T09:25:00Z" },
      { view_id = "v3", ad_id = "ad3", campaign = "new laptops", viewed = "2026-04-01T09:02:00Z", click_id = null, clicked = null },
      { view_id = "v5", ad_id = "ad4", campaign = "new laptops", viewed = "2026-04-01T09:06:00Z", click_id = null, clicked = null },
    ]
  }
  expect {
    sink     = sink.late
    messages = [{ click_id = "k6", ad_id = "ad4", ts = "2026-04-01T08:50:00Z" }]
  }
  assert {
    condition     = metrics.clicked_views.late == 1
    error_message = "the click of 08:50, written after a click of 09:25 in its partition, is late"
  }
}

run "a click before its view does not match it, and a view waits for its clicks" {
  reset = true # a fresh pipeline: the last run left the watermark past these times
  send {
    source = source.campaigns
    file   = "../data/campaigns.jsonl"
  }
  step {
    send {
      source   = source.views
      messages = [{ view_id = "w1", ad_id = "ad9", campaign_id = "c2", ts = "2026-04-02T10:00:00Z" }]
    }
    send {
      source = source.clicks
      messages = [
        { click_id = "b1", ad_id = "ad9", ts = "2026-04-02T09:59:59Z" },
        { click_id = "b2", ad_id = "ad9", ts = "2026-04-02T10:10:00Z" },
      ]
    }
    advance = "30s"
  }
  expect {
    sink     = sink.clicked
    messages = [{ view_id = "w1", ad_id = "ad9", campaign = "new laptops", viewed = "2026-04-02T10:00:00Z", click_id = "b2", clicked = "2026-04-02T10:10:00Z" }]
  }
}

run "a view that waits in the join's state survives a crash" {
  reset = true
  send {
    source = source.campaigns
    file   = "../data/campaigns.jsonl"
  }
  step {
    send {
      source   = source.views
      messages = [{ view_id = "x1", ad_id = "ad7", campaign_id = "c1", ts = "2026-04-03T08:00:00Z" }]
    }
    advance = "10s"
  }
  step {
    crash = true
  }
  step {
    send {
      source   = source.clicks
      messages = [{ click_id = "y1", ad_id = "ad7", ts = "2026-04-03T08:04:00Z" }]
    }
    advance = "3m"
  }
  expect {
    sink     = sink.clicked
    messages = [{ view_id = "x1", ad_id = "ad7", campaign = "spring sale", viewed = "2026-04-03T08:00:00Z", click_id = "y1", clicked = "2026-04-03T08:04:00Z" }]
  }
}
