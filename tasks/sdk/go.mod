module github.com/cyclepool/cyclepool/tasks/sdk

go 1.21
