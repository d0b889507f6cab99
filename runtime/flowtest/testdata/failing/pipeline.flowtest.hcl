# DELIBERATELY FAILING: `flowrun test runtime/flowtest/testdata/failing` must exit 1, and report:
#
#   - run "passes": PASS (so that a failing file's passing runs are still reported);
#   - run "fails": FAIL, with three failures, each at its line here:
#       the expect at line 30: a diff with "- " for {"doubled":5,...} of key "a", which did not
#         arrive, and "+ " for {"doubled":4,...}, which did (the stage doubles 2 into 4, not 5);
#       the expect_dead_letters at line 34: "expected 0 dead letters, 1 message was
#         dead-lettered" (the n of "b" is not a number);
#       the assert at line 38: its error_message, "the stage passes two messages on".

run "passes" {
  send {
    topic    = topic.in
    messages = [{ id = "z", n = 1 }]
  }
  expect {
    sink     = sink.out
    messages = [{ key = "z", payload = { id = "z", n = 1, doubled = 2 } }]
  }
}

run "fails" {
  send {
    topic = topic.in
    messages = [
      { id = "a", n = 2 },
      { id = "b", n = "two" },
    ]
  }
  expect {
    sink     = sink.out
    messages = [{ key = "a", payload = { id = "a", n = 2, doubled = 5 } }]
  }
  expect_dead_letters {
    stage = stage.double
    count = 0
  }
  assert {
    condition     = metrics.double.out == 2
    error_message = "the stage passes two messages on"
  }
}
