.PHONY: run test openapi catalog-schema lock
run:  ## set up and serve on http://127.0.0.1:8000
	bash scripts/run.sh
test: ## set up, lint, type-check and run every test
	bash scripts/test.sh
openapi: ## regenerate openapi.yaml from the app
	.venv/bin/capplan-server openapi -o openapi.yaml
catalog-schema: ## regenerate hardware_catalog/schema.json
	.venv/bin/capplan-server catalog-schema -o hardware_catalog/schema.json
lock: ## regenerate requirements.lock (pinned, hashed runtime deps for the image; needs PyPI)
	bash scripts/lock.sh
