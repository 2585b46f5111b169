#!/bin/bash
echo "$1" > greeting.txt
