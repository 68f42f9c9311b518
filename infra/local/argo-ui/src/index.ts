import * as models from './models';

export * from './components';
export * from './context';

export {
    models,
};
