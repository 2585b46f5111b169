#!/bin/bash
# Checks that every photos/*.jpeg became photos/*.jpg with its contents, and notes.txt stayed.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -z "$(ls photos/*.jpeg 2>/dev/null)" ] || fail "a .jpeg file is left"
[ "$(cat photos/beach.jpg 2>/dev/null)" = "fake image beach" ] || fail "photos/beach.jpg is missing or changed"
[ "$(cat photos/city-night.jpg 2>/dev/null)" = "fake image city-night" ] || fail "photos/city-night.jpg is missing or changed"
[ "$(cat photos/dog.jpg 2>/dev/null)" = "fake image dog" ] || fail "photos/dog.jpg is missing or changed"
[ "$(cat photos/mountain_2019.jpg 2>/dev/null)" = "fake image mountain_2019" ] || fail "photos/mountain_2019.jpg is missing or changed"
[ "$(cat photos/sunset.jpg 2>/dev/null)" = "fake image sunset" ] || fail "photos/sunset.jpg is missing or changed"
[ "$(cat photos/notes.txt 2>/dev/null)" = "not a photo" ] || fail "photos/notes.txt changed"
pass
