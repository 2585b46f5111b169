#!/bin/bash
git init -q -b main .
git config user.name "Rolltap Example"
git config user.email "example@rolltap.invalid"
printf '# Inventory service\n' > README.md
git add README.md
git commit -q -m "Initial commit"
git rev-parse main > .git/rolltap-main
